package kvindex

import "math/bits"

// kslot is one slot of a shard's key table: the key and its holder (or overflow
// marker) side by side, so one cache line answers a probe.
type kslot struct {
	k uint64 // 0 = empty
	h holder
}

// ktab is rh specialised for the lookup path: array of structs (16-byte slots, 4 per
// cache line) instead of parallel arrays, since Lookup reads the holder of every key
// it finds. Measured: 2 cache misses per key → 1 (BENCHMARKS.md "KV index").
type ktab struct {
	s []kslot
	n int
}

// home is k's preferred slot: the keyed mix (block keys may be chosen by a KV event
// publisher or a peer, so their own bits are not trusted to be uniform), then one
// multiply-shift range reduction of the bits below the 5 that chose the shard.
func (t *ktab) home(k uint64) int { return t.homeOf(mix(k)) }

// homeOf is the home slot of a key whose mix is m.
func (t *ktab) homeOf(m uint64) int {
	hi, _ := bits.Mul64(m<<5, uint64(len(t.s)))
	return int(hi)
}

func (t *ktab) dist(i int) int {
	d := i - t.home(t.s[i].k)
	if d < 0 {
		d += len(t.s)
	}
	return d
}

// touch loads the home slot of the key whose mix is m and returns its key, for a
// caller to fold into a value the compiler cannot drop (lookupSink): a read-ahead.
func (t *ktab) touch(m uint64) uint64 {
	if len(t.s) == 0 {
		return 0
	}
	return t.s[t.homeOf(m)].k
}

// find returns k's slot or -1.
func (t *ktab) find(k uint64) int {
	k = rhKey(k)
	return t.findMixed(k, mix(k))
}

// findMixed is find of k (already rhKey'd) whose mix is m. Robin Hood's early exit (a
// slot whose entry sits nearer its home than k would: k is absent) costs a mix of that
// entry's key, so the first scanFree slots are scanned without it: a held key is
// found by loads and compares alone (at load 0.9 the mean distance is ≈ 4.5), an
// absent one costs those slots more than with the exit checked from the start.
func (t *ktab) findMixed(k, m uint64) int {
	n := len(t.s)
	if n == 0 {
		return -1
	}
	i := t.homeOf(m)
	for d := 0; ; d++ {
		kk := t.s[i].k
		if kk == k {
			return i
		}
		if kk == 0 || d >= scanFree && t.dist(i) < d {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

// scanFree is how many slots findMixed scans before it checks Robin Hood's exit.
const scanFree = 8

// probe returns k's slot, or −1 with where inserting k would start: slot at, at
// distance d from k's home (an empty slot or a richer entry). Valid until the table
// changes.
func (t *ktab) probe(k uint64) (slot, at, d int) {
	n := len(t.s)
	if n == 0 {
		return -1, -1, 0
	}
	k = rhKey(k)
	i := t.home(k)
	for d = 0; ; d++ {
		kk := t.s[i].k
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

// insert adds k (absent) with h.
func (t *ktab) insert(k uint64, h holder) { t.insertAt(k, h, -1, 0) }

// insertAt adds k (absent) with h, starting at slot at, distance d, from a probe of
// the unchanged table (at < 0: from k's home).
func (t *ktab) insertAt(k uint64, h holder, at, d int) {
	if (t.n+1)*10 > len(t.s)*9 { // load > 0.9 (Robin Hood keeps probes short up there)
		t.resize(max(rhMinSize, len(t.s)*5/4))
		at = -1
	}
	cur := kslot{rhKey(k), h}
	n := len(t.s)
	i := at
	if i < 0 {
		i, d = t.home(cur.k), 0
	}
	for ; ; d++ {
		if t.s[i].k == 0 {
			t.s[i] = cur
			t.n++
			return
		}
		if di := t.dist(i); di < d {
			cur, t.s[i] = t.s[i], cur
			d = di
		}
		if i++; i == n {
			i = 0
		}
	}
}

// del removes slot i with backward shift.
func (t *ktab) del(i int) {
	n := len(t.s)
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		if t.s[j].k == 0 || t.dist(j) == 0 {
			t.s[i] = kslot{}
			break
		}
		t.s[i] = t.s[j]
		i = j
	}
	t.n--
	if len(t.s) > rhMinSize*4 && t.n*5 < len(t.s) {
		t.resize(len(t.s) / 2)
	}
}

func (t *ktab) resize(size int) {
	old := t.s
	t.s, t.n = make([]kslot, size), 0
	for _, s := range old {
		if s.k != 0 {
			t.insert(s.k, s.h)
		}
	}
}
