package scoring

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/workers"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// loraCand is a candidate whose scrape (at t0) lists running and waiting adapters.
func loraCand(name string, max int, running, waiting []string) Candidate {
	c := cand(name, 0, 0)
	c.Load = workers.Load{ScrapedAt: t0, Adapters: workers.Adapters{Running: running, Waiting: waiting, MaxLoRAs: max}}
	return c
}

func adapterInput(adapter string, at time.Time) *Input {
	in := input(512)
	in.Adapter, in.Now = adapter, at
	return in
}

func TestAdapterStates(t *testing.T) {
	at := t0.Add(100 * time.Millisecond)
	cases := []struct {
		name string
		c    Candidate
		used adapterUse
		want AdapterState
	}{
		{"running there", loraCand("a", 2, []string{"x"}, nil), nil, AdapterLoaded},
		{"waiting there (being loaded)", loraCand("a", 2, nil, []string{"x"}), nil, AdapterLoaded},
		{"free slot", loraCand("a", 2, []string{"y"}, nil), nil, AdapterFreeSlot},
		{"slots full of running adapters", loraCand("a", 2, []string{"y", "z"}, nil), nil, AdapterBlocked},
		{"used here before, still in a slot (LRU)", loraCand("a", 2, []string{"y"}, nil),
			adapterUse{"x": t0.Add(-time.Second)}, AdapterLoaded},
		{"used before but pushed out by more recent ones", loraCand("a", 2, []string{"y"}, nil),
			adapterUse{"x": t0.Add(-2 * time.Second), "w": t0.Add(-time.Second)}, AdapterEvict},
		{"slots filled by this policy's picks since the scrape", loraCand("a", 2, []string{"y"}, nil),
			adapterUse{"w": t0.Add(50 * time.Millisecond)}, AdapterBlocked},
		{"no LoRA state exported", cand("a", 0, 0), adapterUse{"x": t0}, AdapterNone},
	}
	for _, c := range cases {
		if got := adapterState(adapterInput("x", at), &c.c, c.used); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	base := loraCand("a", 2, []string{"y", "z"}, nil)
	if got := adapterState(adapterInput("", at), &base, nil); got != AdapterNone {
		t.Errorf("base-model request: %v, want none", got)
	}
}

func TestPredictionAddsAdapterLoad(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), AdapterLoadTime: 300 * time.Millisecond, AdapterSlotWait: time.Second}, true)
	in := adapterInput("x", t0)
	loaded, free, blocked := loraCand("a", 2, []string{"x"}, nil), loraCand("b", 2, nil, nil), loraCand("c", 1, []string{"y"}, nil)
	pl, pf, pb := p.Predict(in, &loaded), p.Predict(in, &free), p.Predict(in, &blocked)
	if pl.Adapter != 0 || pf.Adapter != 300*time.Millisecond || pb.Adapter != 1300*time.Millisecond {
		t.Fatalf("adapter terms: loaded %v free %v blocked %v, want 0, 300ms, 1.3s", pl.Adapter, pf.Adapter, pb.Adapter)
	}
	if pf.TTFT-pl.TTFT != 300*time.Millisecond {
		t.Fatalf("the load time must be in the TTFT: %v vs %v", pf.TTFT, pl.TTFT)
	}
	if pf.Features[TermAdapter] != 0.3 {
		t.Fatalf("adapter feature %v, want 0.3 s (learned like the other terms)", pf.Features[TermAdapter])
	}
}

// The predictor prefers the worker holding the adapter even behind some queue, but not
// behind a queue longer than the load; once it sent the adapter somewhere, later
// requests for it find it loaded there before the next scrape says so.
func TestPredictorAdapterAffinity(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	p := NewPredictor(Options{Rand: seeded(1), AdapterLoadTime: 500 * time.Millisecond, Metrics: m.Scoring}, true)
	holder, other := loraCand("a", 4, []string{"x"}, nil), loraCand("b", 4, nil, nil)
	holder.Booked = Booked{Requests: 1, Prefilling: 1, PrefillTokens: 1000} // 0.2 s of queue at 5000 tok/s
	if d := p.Pick(adapterInput("x", t0), []Candidate{holder, other}); d.Index != 0 {
		t.Fatalf("picked %d: 0.2 s of queue beats a 0.5 s load", d.Index)
	}
	holder.Booked.PrefillTokens = 5000 // 1 s of queue
	if d := p.Pick(adapterInput("x", t0), []Candidate{holder, other}); d.Index != 1 {
		t.Fatalf("picked %d: a 0.5 s load beats 1 s of queue", d.Index)
	}
	// b now holds x as far as the predictor knows: no load priced there any more.
	if pr := p.Predict(adapterInput("x", t0.Add(time.Millisecond)), &other); pr.Adapter != 0 {
		t.Fatalf("after sending x to b its load is still priced: %v", pr.Adapter)
	}
	if got := testutil.ToFloat64(m.Scoring.AdapterPicks.WithLabelValues("loaded")); got != 1 {
		t.Errorf("adapter_picks_total{loaded} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Scoring.AdapterPicks.WithLabelValues("free_slot")); got != 1 {
		t.Errorf("adapter_picks_total{free_slot} = %v, want 1", got)
	}
}

func TestAdapterMemoryBounded(t *testing.T) {
	u := adapterUse{}
	for i := 0; i < 3*maxAdapterMemory; i++ {
		u.touch(fmt.Sprint("a", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(u) != maxAdapterMemory {
		t.Fatalf("%d adapters remembered, want %d", len(u), maxAdapterMemory)
	}
	u.touch("late", t0.Add(time.Hour))
	u.touch("late", t0) // an older sighting does not move it back
	if !u["late"].Equal(t0.Add(time.Hour)) {
		t.Fatalf("older touch moved the last use back")
	}
}

func TestLoRAAffinityBaseline(t *testing.T) {
	p := mustNew(PolicyLoRAAffinity, Options{Rand: seeded(1)})
	active, room, full := loraCand("a", 2, []string{"x"}, nil), loraCand("b", 2, []string{"y"}, nil), loraCand("c", 2, []string{"y", "z"}, nil)
	active.Booked = Booked{Requests: 3, Prefilling: 3, PrefillTokens: 3000}
	for i := 0; i < 20; i++ {
		if d := p.Pick(adapterInput("x", t0), []Candidate{full, room, active}); d.Index != 2 {
			t.Fatalf("the worker running the adapter scores 1.0: picked %d", d.Index)
		}
	}
	if d := p.Pick(adapterInput("w", t0), []Candidate{full, room, active}); d.Index == 0 {
		t.Fatalf("a worker with no room scores 0: picked it")
	}
	// Saturated (llm-d's detector: 5 waiting) holders are left for the next tier.
	active.Load.Waiting = 6
	if d := p.Pick(adapterInput("x", t0), []Candidate{full, room, active}); d.Index == 2 {
		t.Fatalf("picked the saturated holder")
	}
}

// Loading into a free slot and in place of an idle adapter cost this request the same
// load; the eviction also costs the evicted adapter's next request one, so the free
// slot wins (with some queue too, up to the load time).
func TestPickPrefersAFreeSlotToAnEviction(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1), AdapterLoadTime: 500 * time.Millisecond}, true)
	full := loraCand("a", 2, nil, nil)
	full.Load.Adapters.Waiting = nil
	p.Pick(adapterInput("y", t0.Add(-2*time.Second)), []Candidate{full}) // a holds y and z, both idle by now
	p.Pick(adapterInput("z", t0.Add(-time.Second)), []Candidate{full})
	free := loraCand("b", 2, nil, nil)
	free.Booked = Booked{Requests: 1, Prefilling: 1, PrefillTokens: 1500} // 0.3 s of queue
	in := adapterInput("x", t0.Add(time.Second))
	if s := adapterState(in, &full, p.workers["a"].adapters); s != AdapterEvict {
		t.Fatalf("a: %v, want evict", s)
	}
	if d := p.Pick(in, []Candidate{full, free}); d.Index != 1 {
		t.Fatalf("picked %d: the eviction's displaced reload (0.5 s) outweighs 0.3 s of queue", d.Index)
	}
}
