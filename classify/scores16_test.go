package classify

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestScores16MatchesScalar checks the SWAR sum against the scalar sum of the same
// quantities, over more hits than one flush holds and with the largest weights and
// idfs a row can hold (no lane carries into its neighbour).
func TestScores16MatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name  string
		rows  int
		hits  int
		big   bool
		label int
	}{
		{"few", 10, 7, false, 14},
		{"many", 300, 3*flushEvery + 17, false, 15},
		{"extremes", 4, 2 * flushEvery, true, 9},
	} {
		p := &packed{stride: 16, rows: make([]byte, tc.rows*16)}
		for i := range p.rows {
			p.rows[i] = byte(r.IntN(256))
			if tc.big {
				p.rows[i] = []byte{0, 255}[r.IntN(2)]
			}
		}
		hits := make([]hit, tc.hits)
		for i := range hits {
			hits[i] = hit{row: uint32(r.IntN(tc.rows)), tf: sublinear(uint32(1 + r.IntN(40)))}
			if tc.big {
				hits[i].tf = sublinear(4000)
			}
		}
		out := make([]float32, tc.label)
		norm := p.scores16(hits, out)
		want := make([]float64, tc.label)
		var wantNorm float64
		for _, h := range hits {
			row := p.rows[h.row*16 : h.row*16+16]
			xf := h.tf * float32(row[15])
			wantNorm += float64(xf) * float64(xf)
			x := math.Floor(float64(xf*xScale + 0.5))
			for c := range want {
				want[c] += (float64(row[c]) - 128) * x / xScale
			}
		}
		for c := range out {
			if d := math.Abs(float64(out[c]) - want[c]); d > 1e-6*math.Max(1, math.Abs(want[c])) {
				t.Errorf("%s: label %d: scores16 %v, scalar %v", tc.name, c, out[c], want[c])
			}
		}
		if d := math.Abs(float64(norm) - wantNorm); d > 1e-4*wantNorm {
			t.Errorf("%s: norm %v, want %v", tc.name, norm, wantNorm)
		}
	}
}
