package app

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/testrun"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/kvindex/kvtest"
)

// End to end inside the process: a worker's KV events, published on a real ZMQ socket in
// vLLM's wire format, reach the index through the app's subscriber manager, and the
// router's choice follows them.
func TestKVEventsDriveThePick(t *testing.T) {
	pubs := map[string]*kvtest.Publisher{}
	cfg := config.Default()
	cfg.Scoring.Policy = "kvroute"
	cfg.Models = []config.Model{{Name: "m", BlockSize: 16}}
	for _, n := range []string{"a", "b"} {
		p, err := kvtest.New(kvtest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pubs[n] = p
		cfg.Workers = append(cfg.Workers, config.Worker{Name: n, Address: "127.0.0.1:900" + map[string]string{"a": "1", "b": "2"}[n],
			KVEvents: config.WorkerKVEvents{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}})
	}
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, a, Listeners{})

	ids := make([]string, 64)
	toks := make([]uint32, 64)
	for i := range ids {
		ids[i] = "1" + strings.Repeat("0", i%3)
		toks[i] = uint32(map[int]uint32{0: 1, 1: 10, 2: 100}[i%3])
	}
	// b's engine stored the first 3 blocks (48 tokens) of the prompt.
	ev := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.Uint(0xc1ee), kvevents.Uint(0x60b6), kvevents.Uint(0x91ab)},
		TokenIDs: toks[:48], BlockSize: 16, Medium: "GPU", SpecKind: "full_attention"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := a.Index.Summary("b")
		if s.EngineEntries == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's events never reached the index: %+v", s)
		}
		// PUB drops until the SUB is connected; a repeated store only adds a reference.
		_, _ = pubs["b"].Publish(&kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []kvevents.Event{ev}, HasDPRank: true})
		time.Sleep(20 * time.Millisecond)
	}
	if s, _ := a.Index.Summary("b"); s.Mode != "exact" {
		t.Fatalf("b's mode %q, want exact", s.Mode)
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `]}`
	rec, out := explain(t, a, "/debug/explain?path=/v1/completions", body, nil)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if out.Chosen != "b" || out.Workers[1].CachedTokens != 48 {
		t.Fatalf("the pick must follow b's KV events (48 cached tokens): %+v", out)
	}
}
