package tokenize

import (
	"container/heap"
	"math"
)

// bpe is a byte-level BPE model: the Hugging Face tokenizers "BPE" model over raw
// bytes. Merge priority is the position of the merge in tokenizer.json's "merges"
// list (lower merges first), exactly as tokenizers/src/models/bpe/word.rs merge_all
// does; no assumption that merge ranks equal token ids is made.
type bpe struct {
	byteID [256]uint32 // id of each single byte token
	// pairs maps (left id, right id) to (rank<<32 | merged id).
	pairs pairTable
	// words maps the bytes of a whole vocabulary entry to its id; used by
	// ignore_merges (a pre-token that is itself in the vocabulary is emitted whole).
	words        map[string]uint32
	ignoreMerges bool
	// sp is set for a SentencePiece-style model (sentencepiece.go): symbols start as
	// characters, and byteID holds the <0xNN> byte-fallback tokens.
	sp *spVocab
}

const noRank = math.MaxUint32

// encode appends the ids of one pre-token (raw bytes in a string) to dst.
func (m *bpe) encode(dst []uint32, w string) []uint32 {
	switch len(w) {
	case 0:
		return dst
	case 1:
		return append(dst, m.byteID[w[0]])
	}
	if m.ignoreMerges {
		if id, ok := m.words[w]; ok {
			return append(dst, id)
		}
	}
	if len(w) <= 48 {
		return m.encodeSmall(dst, w)
	}
	return m.encodeHeap(dst, w)
}

// encodeSmall is the quadratic merge loop for short pre-tokens: find the lowest-rank
// adjacent pair (leftmost on ties), merge it, repeat. For words up to a few dozen
// bytes it beats a heap. Equivalent to word.rs merge_all, whose heap orders by
// (rank, position).
func (m *bpe) encodeSmall(dst []uint32, w string) []uint32 {
	var symBuf [48]uint32
	syms := symBuf[:len(w)]
	for i := 0; i < len(w); i++ {
		syms[i] = m.byteID[w[i]]
	}
	return m.mergeSmall(dst, syms)
}

// mergeSmall runs the merges over at most 48 initial symbols (modified in place) and
// appends the result to dst.
func (m *bpe) mergeSmall(dst []uint32, syms []uint32) []uint32 {
	if len(syms) < 2 {
		return append(dst, syms...)
	}
	var rankBuf [48]uint64 // rank<<32|merged id of pair (i, i+1); noRank<<32 if none
	ranks := rankBuf[:len(syms)-1]
	for i := range ranks {
		ranks[i] = m.pairs.get(syms[i], syms[i+1])
	}
	for len(syms) > 1 {
		best, bi := uint64(noRank)<<32, -1
		for i, r := range ranks {
			if r < best {
				best, bi = r, i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = uint32(best)
		copy(syms[bi+1:], syms[bi+2:])
		syms = syms[:len(syms)-1]
		copy(ranks[bi:], ranks[bi+1:])
		ranks = ranks[:len(ranks)-1]
		if bi > 0 {
			ranks[bi-1] = m.pairs.get(syms[bi-1], syms[bi])
		}
		if bi < len(ranks) {
			ranks[bi] = m.pairs.get(syms[bi], syms[bi+1])
		}
	}
	return append(dst, syms...)
}

// mergeItem is a candidate merge of symbol pos with its right neighbour.
type mergeItem struct {
	rank uint32
	pos  int32
	// left/right ids at push time, to detect stale entries.
	left, right uint32
}

type mergeHeap []mergeItem

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeItem)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encodeHeap is word.rs merge_all: a priority queue of (rank, position) over a doubly
// linked list of symbols, O(n log n) for long pre-tokens (runs of CJK, base64, …).
func (m *bpe) encodeHeap(dst []uint32, w string) []uint32 {
	id := make([]uint32, len(w))
	for i := 0; i < len(w); i++ {
		id[i] = m.byteID[w[i]]
	}
	return m.mergeHeap(dst, id)
}

// mergeHeap runs the merges over initial symbols id (modified in place; at least
// one) with a heap and appends the result to dst.
func (m *bpe) mergeHeap(dst []uint32, id []uint32) []uint32 {
	n := len(id)
	if n < 2 {
		return append(dst, id...)
	}
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := 0; i < n; i++ {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
		alive[i] = true
	}
	next[n-1] = -1
	h := make(mergeHeap, 0, n)
	for i := 0; i < n-1; i++ {
		if r := m.pairs.get(id[i], id[i+1]); r>>32 != noRank {
			h = append(h, mergeItem{rank: uint32(r >> 32), pos: int32(i), left: id[i], right: id[i+1]})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		it := heap.Pop(&h).(mergeItem)
		p := it.pos
		if !alive[p] || id[p] != it.left {
			continue
		}
		q := next[p]
		if q < 0 || id[q] != it.right {
			continue
		}
		r := m.pairs.get(id[p], id[q])
		id[p] = uint32(r)
		alive[q] = false
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if r2 := m.pairs.get(id[pp], id[p]); r2>>32 != noRank {
				heap.Push(&h, mergeItem{rank: uint32(r2 >> 32), pos: pp, left: id[pp], right: id[p]})
			}
		}
		if nq := next[p]; nq >= 0 {
			if r2 := m.pairs.get(id[p], id[nq]); r2>>32 != noRank {
				heap.Push(&h, mergeItem{rank: uint32(r2 >> 32), pos: p, left: id[p], right: id[nq]})
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, id[i])
	}
	return dst
}

// pairTable is an open-addressing hash table from an id pair to rank<<32|merged id.
// It was written instead of a Go map because pair lookups dominate BPE time.
type pairTable struct {
	keys []uint64 // left<<32|right, 0 = empty (id pair (0,0) is stored in zeroVal)
	vals []uint64
	mask uint64
	zero uint64 // value for key 0, noRank<<32 if absent
}

func newPairTable(n int) pairTable {
	size := 1
	for size < n*2 {
		size <<= 1
	}
	return pairTable{keys: make([]uint64, size), vals: make([]uint64, size), mask: uint64(size - 1), zero: uint64(noRank) << 32}
}

func pairHash(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k
}

func (t *pairTable) put(l, r uint32, v uint64) {
	k := uint64(l)<<32 | uint64(r)
	if k == 0 {
		t.zero = v
		return
	}
	for i := pairHash(k) & t.mask; ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case 0:
			t.keys[i], t.vals[i] = k, v
			return
		case k:
			t.vals[i] = v // a repeated pair: the later merge wins, as collecting into a HashMap does in bpe/model.rs
			return
		}
	}
}

// get returns rank<<32|merged id, or noRank<<32 when (l, r) does not merge.
func (t *pairTable) get(l, r uint32) uint64 {
	k := uint64(l)<<32 | uint64(r)
	if k == 0 {
		return t.zero
	}
	for i := pairHash(k) & t.mask; ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return t.vals[i]
		case 0:
			return uint64(noRank) << 32
		}
	}
}
