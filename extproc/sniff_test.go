package extproc

import "testing"

// A BUFFERED_PARTIAL body cut at the buffer limit with two "model" keys is routed on
// the last one, as vLLM's full parse reads it (issue 11 item 13). Before, the sniff
// took the first ("other", served by no worker here: a 404).
func TestBufferedPartialDuplicateModelLastWins(t *testing.T) {
	h := newHarness(t)
	s := h.open(t)
	s.send(withPC(hdrs(false, post("/v1/chat/completions")...), modeBufferedPartial, modeStreamed))
	s.recv()
	s.send(body(`{"model":"other","stream":true,"model":"m","messages":[{"role":"user","content":"long long`, false))
	r := s.recv()
	if ir := r.GetImmediateResponse(); ir != nil {
		t.Fatalf("refused with %d %s: the first model key was used", ir.GetStatus().GetCode(), ir.GetBody())
	}
	if destOf(t, r.GetRequestBody().GetResponse().GetHeaderMutation(), dest) == "" {
		t.Fatal("partial body reply must carry the decision")
	}
	_, ts := h.router.Snapshot()
	if len(ts) != 1 || ts[0].Model != "m" {
		t.Fatalf("want the last model key, tickets %+v", ts)
	}
	s.send(body("rest", true))
	s.recv()
}
