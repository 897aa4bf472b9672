package classify

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestGroupDirectMatchesHash checks that the direct table and open addressing give the
// same features in the same first-seen order with the same counts, including a text
// with a feature seen 255 times or more (the direct table's fallback), and that the
// direct table is left clear for the next text.
func TestGroupDirectMatchesHash(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const bits = 18
	for _, tc := range []struct {
		name      string
		n, space  int
		hot, hotN int
	}{
		{"sparse", 500, 1 << bits, -1, 0},
		{"dense", 5000, 300, -1, 0},
		{"count-254", 1000, 1 << bits, 77, 254},
		{"count-255", 1000, 1 << bits, 77, 255},
		{"count-1000", 1000, 1 << bits, 77, 1000},
	} {
		var occ []uint32
		for range tc.n {
			occ = append(occ, uint32(r.IntN(tc.space)))
		}
		for range tc.hotN {
			occ = slices.Insert(occ, r.IntN(len(occ)+1), uint32(tc.hot))
		}
		g := &grouper{occ: occ}
		g.group(bits)
		keys, counts := slices.Clone(g.keys), slices.Clone(g.counts)
		g.groupHash()
		if !slices.Equal(keys, g.keys) || !slices.Equal(counts, g.counts) {
			t.Fatalf("%s: group and groupHash disagree (%d vs %d keys)", tc.name, len(keys), len(g.keys))
		}
		var total uint32
		for _, c := range counts {
			total += c
		}
		if int(total) != len(occ) {
			t.Errorf("%s: counts sum to %d, want %d", tc.name, total, len(occ))
		}
		if i := slices.IndexFunc(g.direct, func(b uint8) bool { return b != 0 }); i >= 0 {
			t.Errorf("%s: direct table left entry %d at %d", tc.name, i, g.direct[i])
		}
	}
}
