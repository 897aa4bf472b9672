package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/response"
)

// Each ticket outcome, through both fronts: the worker answers as the case says
// (scripts in worker_test.go), and the front's request counter counts the request
// once with that outcome. The outcome also decides learning (router.Ticket.Complete):
// the E2E histogram has one observation per ok request only.

func TestOutcomes(t *testing.T) {
	outcomesThroughFront(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}})
}

func TestProxyOutcomes(t *testing.T) {
	outcomesThroughFront(t, fixtureOpts{proxy: true})
}

// requestsByOutcome reads the front's request counter for outcome o (summed over the
// proxy's code label).
func (f *fixture) requestsByOutcome(o response.Outcome) float64 {
	m := f.app.Metrics.ExtProc
	if f.envoy != nil {
		return testutil.ToFloat64(m.Requests.WithLabelValues(string(o)))
	}
	sum := 0.0
	for _, code := range []string{"2xx", "3xx", "4xx", "5xx", "error"} {
		if c, err := m.ProxyRequests.GetMetricWith(prometheus.Labels{"code": code, "outcome": string(o)}); err == nil {
			sum += testutil.ToFloat64(c)
		}
	}
	return sum
}

// waitOutcome waits (generously: no speed assumption) until the front counted want
// requests with outcome o. The ext_proc server counts an aborted request when Envoy
// closes the stream, which a client cannot wait on.
func (f *fixture) waitOutcome(o response.Outcome, want float64) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.requestsByOutcome(o) != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("requests{outcome=%s} = %v, want %v", o, f.requestsByOutcome(o), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func outcomesThroughFront(t *testing.T, opts fixtureOpts) {
	t.Helper()
	f := newFixture(t, opts)
	cases := []struct {
		script, body string
		status       int
		want         response.Outcome
	}{
		{"", chatStream, 200, response.OutcomeOK},
		{"", chatNonStream, 200, response.OutcomeOK},
		{"client_error", chatNonStream, 400, response.OutcomeClientError},
		{"upstream_error", chatStream, 500, response.OutcomeUpstreamError},
		{"only_done", chatStream, 200, response.OutcomeTruncated},
		{"error_event", chatStream, 200, response.OutcomeErrorEvent},
		{"json_error", chatNonStream, 200, response.OutcomeErrorEvent},
		{"json_error", chatStream, 200, response.OutcomeErrorEvent}, // a JSON answer to a streaming request is read as JSON
		{"truncated", chatStream, 200, response.OutcomeTruncated},
		{"", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, response.OutcomeRejected},
	}
	count := map[response.Outcome]float64{}
	for _, c := range cases {
		st, _, body := f.do("POST", "/v1/chat/completions", c.body, "X-Test-Script", c.script)
		if st != c.status {
			t.Fatalf("%s: status %d, want %d (body %q)", c.want, st, c.status, body)
		}
		count[c.want]++
		f.waitOutcome(c.want, count[c.want])
	}
	// aborted: the client goes away mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/chat/completions", strings.NewReader(chatStream))
	req.Header.Set("X-Test-Script", "hang_mid_stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, resp, `"Hello"`)
	cancel()
	resp.Body.Close()
	count[response.OutcomeAborted]++
	f.waitOutcome(response.OutcomeAborted, count[response.OutcomeAborted])
	f.waitInFlight(0)
	for _, o := range response.Outcomes {
		if got := f.requestsByOutcome(o); got != count[o] {
			t.Errorf("requests{outcome=%s} = %v, want %v: each request is counted once", o, got, count[o])
		}
	}
	if n := histogramCount(t, f.app.Metrics.Router.E2ESeconds); n != count[response.OutcomeOK] {
		t.Errorf("E2E observations = %v, want %v (ok requests only)", n, count[response.OutcomeOK])
	}
}

// readUntil reads SSE lines from resp until one contains want.
func readUntil(t *testing.T, resp *http.Response, want string) {
	t.Helper()
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before %q: %v", want, err)
		}
		if strings.Contains(line, want) {
			return
		}
	}
}

// histogramCount sums the sample counts of every series of h.
func histogramCount(t *testing.T, h *prometheus.HistogramVec) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	go func() { h.Collect(ch); close(ch) }()
	n := 0.0
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		n += float64(d.GetHistogram().GetSampleCount())
	}
	return n
}

// A client that reads the stream through `data: [DONE]` and hangs up at once — before
// the worker's end of the body reached kvroute — was served: the ticket completes on
// the end marker (outcome ok, usage observed), and the request is counted once, even
// though the proxy's ReverseProxy then panics with http.ErrAbortHandler (its copy
// fails). The worker here keeps the response open after [DONE], so the hang-up always
// comes first.
func TestProxyClientHangsUpOnDone(t *testing.T) {
	clientHangsUpOnDone(t, fixtureOpts{proxy: true})
}

// The same through Envoy: the hang-up resets the ext_proc stream before the last
// response body message.
func TestClientHangsUpOnDone(t *testing.T) {
	clientHangsUpOnDone(t, fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}})
}

func clientHangsUpOnDone(t *testing.T, opts fixtureOpts) {
	t.Helper()
	f := newFixture(t, opts)
	for i := 1; i <= 3; i++ {
		req, _ := http.NewRequest("POST", f.url+"/v1/chat/completions", strings.NewReader(chatStream))
		req.Header.Set("X-Test-Script", "hang_up_on_done")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readUntil(t, resp, "[DONE]")
		resp.Body.Close() // the body has not ended: this closes the connection
		f.waitInFlight(0)
		f.waitOutcome(response.OutcomeOK, float64(i))
	}
	if got := f.requestsByOutcome(response.OutcomeAborted); got != 0 {
		t.Fatalf("requests{outcome=aborted} = %v: a client gone after [DONE] was served", got)
	}
	if got := testutil.ToFloat64(f.app.Metrics.ExtProc.Aborts.WithLabelValues("client_gone")) +
		testutil.ToFloat64(f.app.Metrics.ExtProc.Aborts.WithLabelValues("cancelled")); got != 0 {
		t.Fatalf("aborts = %v, want 0", got)
	}
	if got := testutil.ToFloat64(f.app.Metrics.Router.UsageReports.WithLabelValues("reported")); got != 3 {
		t.Fatalf("usage reports = %v, want 3: the usage before [DONE] is observed", got)
	}
	if f.envoy == nil {
		if got := testutil.ToFloat64(f.app.Metrics.ExtProc.ProxyRequests.WithLabelValues("2xx", "ok")); got != 3 {
			t.Fatalf("kvroute_proxy_requests_total{code=2xx,outcome=ok} = %v, want 3", got)
		}
	}
}

// The proxy counts a ticket released by the sweep as expired when its response
// finally ends.
func TestProxyTicketExpiry(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, fixtureOpts{proxy: true,
		cfg: func(c *config.Config) { c.Router.TicketTTL = time.Second },
		setup: func(ws []*testWorker) {
			for _, w := range ws {
				w.gate = gate
			}
		}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if st, _, _ := f.do("POST", "/v1/chat/completions", chatStream); st != 200 {
			t.Errorf("status %d", st)
		}
	}()
	f.waitInFlight(1)
	deadline := time.Now().Add(20 * time.Second)
	for f.app.Router.InFlight() != 0 { // ages past the 1 s TTL; kvroute's sweeper may release it first
		if time.Now().After(deadline) {
			t.Fatal("ticket never expired")
		}
		f.app.Router.Sweep()
		time.Sleep(20 * time.Millisecond)
	}
	close(gate)
	<-done
	f.waitOutcome(response.OutcomeExpired, 1)
	if got := f.requestsByOutcome(response.OutcomeOK); got != 0 {
		t.Fatalf("an expired ticket's late completion is not ok (%v)", got)
	}
}

// A client that hangs up mid-upload, through Envoy, in every request body mode: real
// Envoy never hands ext_proc a body the client did not finish. The downstream close or
// reset resets the HTTP stream (HCM onResetStream; an HTTP/1 message cut by the
// connection's end is a ConnectionTermination reset, not an end of stream), which
// destroys the ext_proc filter: Filter::onDestroy → closeStream, a half-close and a
// resetStream of the gRPC stream (GC close()), and no body message with end_of_stream.
// kvroute's ext_proc sees the stream cancelled before it picked a worker and counts
// the request aborted — not a 400 rejected for a truncated body — and nothing reaches
// a worker. The stand-in used to send what it had read with end_of_stream=true.
func TestClientGoneMidUploadCountsAborted(t *testing.T) {
	for _, mode := range []Mode{Buffered, BufferedPartial, Streamed, FullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, fixtureOpts{envoy: Config{RequestBodyMode: mode, ResponseBodyMode: Streamed}})
			const n = 3
			headers := f.app.Metrics.ExtProc.Messages.WithLabelValues("request_headers") // received by kvroute
			for i := 0; i < n; i++ {
				c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n%s",
					`{"model":"m","messages":[{"role":"user","content":"hello"}]`)
				// Hang up once kvroute has read the request headers: a reset that
				// overtakes them on the gRPC stream is a request kvroute never saw.
				for d := time.Now().Add(20 * time.Second); testutil.ToFloat64(headers) < float64(i+1) && time.Now().Before(d); {
					time.Sleep(time.Millisecond)
				}
				if i == n-1 { // a reset rather than a close
					c.(*net.TCPConn).SetLinger(0)
				}
				c.Close()
			}
			deadline := time.Now().Add(20 * time.Second)
			for f.requestsByOutcome(response.OutcomeAborted)+f.requestsByOutcome(response.OutcomeRejected) < n && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if a, r := f.requestsByOutcome(response.OutcomeAborted), f.requestsByOutcome(response.OutcomeRejected); a != n || r != 0 {
				t.Fatalf("requests{outcome=aborted} = %v, {outcome=rejected} = %v; want %d and 0", a, r, n)
			}
			f.waitInFlight(0)
			if got := f.envoy.Stats().DownstreamResets; got != n {
				t.Fatalf("stand-in resets = %d, want %d", got, n)
			}
			if mode == Streamed {
				return // picked on the headers: kvroute does not parse the body
			}
			// A body that is merely malformed is still the client's 400.
			if st, _, body := f.do("POST", "/v1/chat/completions", `{"model":`); st != 400 {
				t.Fatalf("malformed body: %d %s", st, body)
			}
			f.waitOutcome(response.OutcomeRejected, 1)
		})
	}
}
