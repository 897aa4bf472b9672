package kvindex

import "math/bits"

// rh is an open-addressing hash table with Robin Hood linear probing and
// backward-shift deletion (no tombstones), keyed by non-zero uint64, storing two
// parallel value arrays (struct of arrays: a probe scans only the 8-byte keys, 8 per
// cache line). It is a multimap: Insert never replaces, callers find first.
//
// Why not map[Key]V: with 16-byte slots and a 0.9 maximum load grown by 1.25× (any
// size, as slots are addressed by multiply-shift rather than a mask), memory per entry
// is about 16/0.8 bytes against ~40 for the Go map with the same payload, and the home
// slot of the next keys can be loaded ahead (Lookup overlaps cache misses). Measured
// in BENCHMARKS.md "KV index".
type rh[A, B any] struct {
	keys []uint64 // 0 = empty
	a    []A
	b    []B
	n    int // occupied slots
}

const rhMinSize = 16

func rhKey(k uint64) uint64 {
	if k == 0 {
		return 1 // 0 marks empty slots; a real 0 shares slot chains with 1 (p = 2^-64)
	}
	return k
}

// home is k's preferred slot: the keyed mix (engine hashes are chosen by the KV event
// publisher; in tests they are small integers) then multiply-shift range reduction.
func (t *rh[A, B]) home(k uint64) int {
	hi, _ := bits.Mul64(mix(k), uint64(len(t.keys)))
	return int(hi)
}

func (t *rh[A, B]) dist(i int) int {
	d := i - t.home(t.keys[i])
	if d < 0 {
		d += len(t.keys)
	}
	return d
}

// Len is the number of entries.
func (t *rh[A, B]) Len() int { return t.n }

// Cap is the number of slots.
func (t *rh[A, B]) Cap() int { return len(t.keys) }

// find returns the first slot at or after the probe start holding k for which match
// returns true, or -1. match nil matches any.
func (t *rh[A, B]) find(k uint64, match func(i int) bool) int {
	if len(t.keys) == 0 {
		return -1
	}
	k = rhKey(k)
	n := len(t.keys)
	i := t.home(k)
	for d := 0; ; d++ {
		kk := t.keys[i]
		if kk == 0 {
			return -1
		}
		if kk == k {
			if match == nil || match(i) {
				return i
			}
		} else if t.dist(i) < d {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// each calls f for every slot holding k until f returns false.
func (t *rh[A, B]) each(k uint64, f func(i int) bool) {
	if len(t.keys) == 0 {
		return
	}
	k = rhKey(k)
	n := len(t.keys)
	i := t.home(k)
	for d := 0; ; d++ {
		kk := t.keys[i]
		if kk == 0 {
			return
		}
		if kk == k {
			if !f(i) {
				return
			}
		} else if t.dist(i) < d {
			return
		}
		if i++; i == n {
			i = 0
		}
	}
}

// probe returns the first slot holding k, or −1 with where inserting k would start:
// slot at, at distance d from k's home. Valid until the table changes.
func (t *rh[A, B]) probe(k uint64) (slot, at, d int) {
	n := len(t.keys)
	if n == 0 {
		return -1, -1, 0
	}
	k = rhKey(k)
	i := t.home(k)
	for d = 0; ; d++ {
		kk := t.keys[i]
		if kk == k {
			return i, -1, 0
		}
		if kk == 0 || t.dist(i) < d {
			return -1, i, d
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insert adds (k, a, b) and returns its slot (valid until the next insert or delete).
func (t *rh[A, B]) insert(k uint64, a A, b B) int { return t.insertAt(k, a, b, -1, 0) }

// insertAt is insert starting at slot at, distance d, from a probe of the unchanged
// table (at < 0: from k's home).
func (t *rh[A, B]) insertAt(k uint64, a A, b B, at, d int) int {
	if (t.n+1)*10 > len(t.keys)*9 { // load > 0.9 (Robin Hood keeps probes short up there)
		t.grow()
		at = -1
	}
	k = rhKey(k)
	n := len(t.keys)
	i := at
	if i < 0 {
		i, d = t.home(k), 0
	}
	placed := -1
	for ; ; d++ {
		if t.keys[i] == 0 {
			t.keys[i], t.a[i], t.b[i] = k, a, b
			t.n++
			if placed < 0 {
				placed = i
			}
			return placed
		}
		if di := t.dist(i); di < d { // Robin Hood: the richer entry moves on
			k, t.keys[i] = t.keys[i], k
			a, t.a[i] = t.a[i], a
			b, t.b[i] = t.b[i], b
			if placed < 0 {
				placed = i
			}
			d = di
		}
		if i++; i == n {
			i = 0
		}
	}
}

// del removes slot i, shifting the following entries back.
func (t *rh[A, B]) del(i int) {
	n := len(t.keys)
	var za A
	var zb B
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		if t.keys[j] == 0 || t.dist(j) == 0 {
			t.keys[i], t.a[i], t.b[i] = 0, za, zb
			break
		}
		t.keys[i], t.a[i], t.b[i] = t.keys[j], t.a[j], t.b[j]
		i = j
	}
	t.n--
	if len(t.keys) > rhMinSize*4 && t.n*5 < len(t.keys) { // load < 0.2: shrink
		t.resize(len(t.keys) / 2)
	}
}

func (t *rh[A, B]) grow() { t.resize(max(rhMinSize, len(t.keys)*5/4)) }

func (t *rh[A, B]) resize(size int) {
	old := *t
	t.keys, t.a, t.b, t.n = make([]uint64, size), make([]A, size), make([]B, size), 0
	for i, k := range old.keys {
		if k != 0 {
			t.insert(k, old.a[i], old.b[i])
		}
	}
}

// bytes is the table's memory: slots times slot size.
func (t *rh[A, B]) bytes(slot int) int { return len(t.keys) * slot }
