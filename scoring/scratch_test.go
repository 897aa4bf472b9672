package scoring

import (
	"fmt"
	"testing"
)

// scratchCands is a varied candidate list: cached prefixes, bookings and a near-tie
// group, so that every per-candidate slice of a pick holds distinct values.
func scratchCands(n, shift int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = cand(fmt.Sprintf("w%03d", i), ((i+shift)%5)*256, ((i*7+shift)%3)*512)
	}
	return out
}

// A Scratch reused across picks of different sizes and inputs decides exactly as a
// pick without one: nothing of an earlier pick (a longer candidate list, other
// predictions, ties, costs) leaks into a later one.
func TestScratchReuseDecidesAsWithout(t *testing.T) {
	with := NewPredictor(Options{Rand: seeded(7)}, true)
	without := NewPredictor(Options{Rand: seeded(7)}, true)
	var sc Scratch
	for step, n := range []int{64, 3, 200, 1, 17, 64, 5} {
		for _, slo := range []int{0, 1} {
			mk := func(s *Scratch) (*Input, []Candidate) {
				in := input(1024 + 128*step)
				in.Scratch = s
				if slo > 0 {
					in.SLO = in.SLO + 50e6 // 50 ms: some meet it, the rest do not
				}
				return in, scratchCands(n, step)
			}
			inA, ca := mk(&sc)
			inB, cb := mk(nil)
			with.Prepare(inA, ca)
			without.Prepare(inB, cb)
			da, db := with.Pick(inA, ca), without.Pick(inB, cb)
			if da.Index != db.Index || da.Reason != db.Reason || da.Shed != db.Shed || len(da.Predictions) != n {
				t.Fatalf("step %d n=%d slo=%d: with scratch %d %q (%d predictions), without %d %q",
					step, n, slo, da.Index, da.Reason, len(da.Predictions), db.Index, db.Reason)
			}
			for i := range da.Predictions {
				if da.Predictions[i] != db.Predictions[i] {
					t.Fatalf("step %d n=%d: prediction %d %+v with scratch, %+v without", step, n, i, da.Predictions[i], db.Predictions[i])
				}
			}
		}
	}
}

// Two picks in flight at once, each with its own Scratch, keep their own predictions:
// one's Decision is not overwritten by the other's pick (a pick's Predictions live in
// the Scratch it was lent, and only there).
func TestScratchesOfConcurrentPicksAreDisjoint(t *testing.T) {
	p := NewPredictor(Options{Rand: seeded(1)}, true)
	var s1, s2 Scratch
	in1, c1 := input(4096), scratchCands(32, 0)
	in1.Scratch = &s1
	in2, c2 := input(256), scratchCands(32, 3)
	in2.Scratch = &s2
	p.Prepare(in1, c1)
	p.Prepare(in2, c2)
	d1 := p.Pick(in1, c1)
	keep := append([]Prediction(nil), d1.Predictions...)
	d2 := p.Pick(in2, c2)
	for i := range keep {
		if d1.Predictions[i] != keep[i] {
			t.Fatalf("prediction %d of the first pick changed by the second: %+v → %+v", i, keep[i], d1.Predictions[i])
		}
	}
	if &d1.Predictions[0] == &d2.Predictions[0] {
		t.Fatal("two scratches share their predictions' array")
	}
}
