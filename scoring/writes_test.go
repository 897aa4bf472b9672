package scoring

import (
	"math"
	"testing"
	"time"
)

// TestDecayedHalvesPerHalfLife: the decayed sum halves every half-life, adds on top of
// the decayed value, and never decays backwards in time.
func TestDecayedHalvesPerHalfLife(t *testing.T) {
	const h = 30 * time.Second
	var d decayed
	if v := d.at(t0, h); v != 0 {
		t.Fatalf("empty sum = %v, want 0", v)
	}
	d.add(1000, t0, h)
	for _, c := range []struct {
		after time.Duration
		want  float64
	}{{0, 1000}, {h, 500}, {2 * h, 250}, {-h, 1000}} {
		if v := d.at(t0.Add(c.after), h); math.Abs(v-c.want) > 1e-9 {
			t.Fatalf("after %v: %v, want %v", c.after, v, c.want)
		}
	}
	d.add(100, t0.Add(h), h)
	if v := d.at(t0.Add(h), h); math.Abs(v-600) > 1e-9 {
		t.Fatalf("after adding 100 one half-life later: %v, want 600", v)
	}
}

// TestColdPlacementPrefersSlowestCacheTurnover: two idle workers predicted the same for
// a cold prompt; the one kvroute recently sent fewer uncached tokens to wins (its LRU
// victim is older), every time, not at random. Once the writes have decayed away the
// choice is a tie again.
func TestColdPlacementPrefersSlowestCacheTurnover(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(3)}, true)
	busy := []Candidate{cand("a", 0, 0)}
	for k := 0; k < 3; k++ { // a prefills three cold 6,000-token prompts
		if d := p.Pick(input(6000), busy); d.Index != 0 {
			t.Fatalf("single candidate: %+v", d)
		}
	}
	both := []Candidate{cand("a", 0, 0), cand("b", 0, 0)}
	for k := 0; k < 50; k++ {
		in := input(6000)
		in.DryRun = true // keep the writes as they are
		d := p.Pick(in, both)
		if both[d.Index].Worker.Name != "b" || d.Reason != ReasonTie {
			t.Fatalf("pick %d: the worker with fewer recent writes must win the tie: %+v", k, d)
		}
	}
	// After 20 half-lives a's writes are gone: both are picked (at random).
	seen := map[string]bool{}
	for k := 0; k < 50; k++ {
		in := input(6000)
		in.Now = t0.Add(20 * 30 * time.Second)
		in.DryRun = true
		seen[both[p.Pick(in, both).Index].Worker.Name] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("decayed writes must tie again: picked %v", seen)
	}
}

// TestDryRunRecordsNoWrites: /debug/explain must not change later decisions.
func TestDryRunRecordsNoWrites(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(3)}, true)
	in := input(6000)
	in.DryRun = true
	for k := 0; k < 5; k++ {
		p.Pick(in, []Candidate{cand("a", 0, 0)})
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if wm := p.workers["a"]; wm != nil && wm.writes.v != 0 {
		t.Fatalf("dry runs recorded %v written tokens", wm.writes.v)
	}
}
