package classify

import "sync"

// grouper counts a text's feature occurrences: keys holds the distinct features in
// first-seen order and counts[i] the occurrences of keys[i].
//
// For feature spaces up to 2^directBits it counts in a direct table of one byte per
// feature (1 MiB at 2^20), with no probe and no branch on whether a feature is new
// beyond one well-predicted compare, and clears only the entries it touched; it falls
// back to open addressing with a generation stamp (no table cleared between texts) for
// larger spaces and for a text in which some feature occurs 255 times or more.
type grouper struct {
	occ    []uint32
	keys   []uint32
	counts []uint32
	hits   []hit

	direct []uint8

	gen   uint32
	slots []gslot
}

type gslot struct{ gen, key, idx uint32 }

// directBits bounds the feature spaces counted in a direct table (2^20 bytes).
const directBits = 20

var grouperPool = sync.Pool{New: func() any { return &grouper{occ: make([]uint32, 0, 8192)} }}

// group fills g.keys and g.counts from g.occ, whose features are under 1<<bits.
func (g *grouper) group(bits uint8) {
	if bits <= directBits && g.groupDirect(bits) {
		return
	}
	g.groupHash()
}

// groupDirect counts in the direct table; it reports false, leaving the table clear,
// when a count reaches 255 (one byte no longer holds it).
func (g *grouper) groupDirect(bits uint8) bool {
	if len(g.direct) < 1<<bits {
		g.direct = make([]uint8, 1<<bits)
	}
	direct := g.direct[:1<<bits]
	occ := g.occ
	if cap(g.keys) < len(occ) {
		g.keys, g.counts = make([]uint32, len(occ)), make([]uint32, len(occ))
	}
	keys := g.keys[:len(occ)]
	mask := uint32(1)<<bits - 1
	n := 0
	var top uint8
	for _, f := range occ {
		c := direct[f&mask]
		keys[n] = f
		if c == 0 {
			n++
		}
		c++
		top = max(top, c)
		direct[f&mask] = c
	}
	keys = keys[:n]
	counts := g.counts[:n]
	for i, f := range keys {
		counts[i] = uint32(direct[f&mask])
		direct[f&mask] = 0
	}
	g.keys, g.counts = keys, counts
	return top < 255
}

// groupHash counts by open addressing (linear probing, load under 1/2).
func (g *grouper) groupHash() {
	size := 1024
	for size < 2*len(g.occ) {
		size <<= 1
	}
	if len(g.slots) < size {
		g.slots, g.gen = make([]gslot, size), 0
	}
	g.gen++
	if g.gen == 0 {
		clear(g.slots)
		g.gen = 1
	}
	g.keys, g.counts = g.keys[:0], g.counts[:0]
	mask := uint32(len(g.slots) - 1)
	for _, f := range g.occ {
		for j := f & mask; ; j = (j + 1) & mask {
			s := &g.slots[j]
			if s.gen != g.gen {
				*s = gslot{gen: g.gen, key: f, idx: uint32(len(g.keys))}
				g.keys = append(g.keys, f)
				g.counts = append(g.counts, 1)
				break
			}
			if s.key == f {
				g.counts[s.idx]++
				break
			}
		}
	}
}
