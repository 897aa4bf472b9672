package kvindex

// engEntry is one (rank, engine hash): the key it maps to, reference counts per tier
// (vLLM may store the same hash twice; each BlockRemoved releases one) saturating at
// 15, and the low 8 bits of the worker generation at its last store (see Desync).
type engEntry struct {
	key  Key
	refs [NumTiers]uint8
	gen  uint8
}

// rank is one data-parallel rank's engine state (engine hashes are per process):
// engine hash → engEntry in an rh table whose second array packs refs and gen in 4
// bytes (20 bytes a slot).
type rank struct {
	t rh[Key, uint32]
}

func packMeta(e engEntry) uint32 {
	var m uint32
	for t := range e.refs {
		m |= uint32(min(e.refs[t], 15)) << (4 * t)
	}
	return m | uint32(e.gen)<<16
}

func unpack(k Key, m uint32) engEntry {
	e := engEntry{key: k, gen: uint8(m >> 16)}
	for t := range e.refs {
		e.refs[t] = uint8(m>>(4*t)) & 15
	}
	return e
}

// slot returns eh's slot (or -1) and its entry.
func (r *rank) slot(eh uint64) (int, engEntry) {
	i := r.t.find(eh, nil)
	if i < 0 {
		return -1, engEntry{}
	}
	return i, unpack(r.t.a[i], r.t.b[i])
}

// setAt stores e at slot i (i < 0: insert under eh).
func (r *rank) setAt(i int, eh uint64, e engEntry) {
	if i < 0 {
		r.t.insert(eh, e.key, packMeta(e))
		return
	}
	r.t.a[i], r.t.b[i] = e.key, packMeta(e)
}

// clear empties the table at once.
func (r *rank) clear() { r.t = rh[Key, uint32]{} }

func (r *rank) get(eh uint64) (engEntry, bool) {
	i := r.t.find(eh, nil)
	if i < 0 {
		return engEntry{}, false
	}
	return unpack(r.t.a[i], r.t.b[i]), true
}

func (r *rank) put(eh uint64, e engEntry) {
	if i := r.t.find(eh, nil); i >= 0 {
		r.t.a[i], r.t.b[i] = e.key, packMeta(e)
		return
	}
	r.t.insert(eh, e.key, packMeta(e))
}

func (r *rank) del(eh uint64) {
	if i := r.t.find(eh, nil); i >= 0 {
		r.t.del(i)
	}
}

func (r *rank) len() int { return r.t.Len() }

type engItem struct {
	eh uint64
	e  engEntry
}

// items returns up to limit entries (limit < 0: all) starting at slot start (mod size).
// Engine hash 0 is reported as 1 (see rhKey).
func (r *rank) items(start, limit int) []engItem {
	n := len(r.t.keys)
	if n == 0 {
		return nil
	}
	var out []engItem
	for j := 0; j < n && (limit < 0 || len(out) < limit); j++ {
		i := (start + j) % n
		if k := r.t.keys[i]; k != 0 {
			out = append(out, engItem{k, unpack(r.t.a[i], r.t.b[i])})
		}
	}
	return out
}
