package kvindex

import (
	"math/bits"
	"sync"
)

// wideBufs holds Lookup's per-worker-id arrays for an index of more than 127 workers
// (smaller ones live on the stack), pooled: at 1,000 workers they are 16 KB a lookup.
// One lookup uses one at a time; every element it reads it first writes.
type wideBufs struct {
	cnt, pos []int32
	bit      []uint64
}

var widePool = sync.Pool{New: func() any { return new(wideBufs) }}

// grown returns s with length n, reusing its array when it is large enough; the
// elements keep whatever they held.
func grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// walkSet is Lookup's walk when at most 64 workers hold keys[0]. found[c] is candidate
// c (Blocks 1, its keys[0] tier counted); cnt[id] > 0 and pos[id] == c for candidates.
// The still-matching candidates are one uint64 bitset, so a holder costs a byte load
// (its candidate bit), a flag test and an OR — no per-holder counter store, no
// string or map access. Tier counts other than GPU are added per holder (rare);
// GPU = Blocks − the others at the end. The walk stops at the first key that leaves
// the set empty, or that no worker holds.
//
// Keys are walked in groups of 8 with read-ahead: while a group is walked, the home
// slots of the next group load, and each of the group's slots was found (and its
// overflow chunk loaded) just before, so the cache misses of 8 keys overlap instead of
// being paid one by one.
func (ix *Index) walkSet(keys []Key, found []Match, cnt, pos []int32, dst []Match, now uint32, wide *wideBufs) []Match {
	// bit[id] is id's candidate bit (0: not a candidate).
	var bitBuf [128]uint64
	var bit []uint64
	if len(cnt) <= len(bitBuf) {
		bit = bitBuf[:len(cnt)]
	} else {
		wide.bit = grown(wide.bit, len(cnt))
		bit = wide.bit
	}
	for id, v := range cnt {
		bit[id] = 0
		if v > 0 {
			bit[id] = 1 << pos[id]
		}
	}
	alive := ^uint64(0) >> (64 - len(found))
	var length [64]int32 // leading blocks of candidates that dropped out
	n := len(keys)
	end := n // keys[:end] matched by every candidate still in alive

	var hs groupHolders
	var mx [2]groupMix // this group's keys' mixes and the next's
	ahead := ix.touchHome(keys, 1, min(1+lookupGroup, n), &mx[0])
walk:
	for g, cur := 1, 0; g < n; g, cur = g+lookupGroup, cur^1 {
		gend := min(g+lookupGroup, n)
		ahead += ix.touchHome(keys, gend, min(gend+lookupGroup, n), &mx[cur^1]) // the next group loads while this one is walked
		ahead += ix.findGroup(keys, g, gend, &hs, &mx[cur])
		for i := g; i < gend; i++ {
			held := hs[i-g]
			if held == nil {
				end = i
				break walk
			}
			var m uint64
			for _, h := range held {
				id := int(h.wf & idMask)
				if id >= len(bit) {
					continue
				}
				if h.wf&fSpec == 0 && h.refs&(1<<tierBits-1) != 0 { // confirmed, GPU: the common case
					m |= bit[id]
					continue
				}
				if b := bit[id]; b != 0 {
					m |= ix.liveBit(h, b, alive, found, now)
				}
			}
			for drop := alive &^ m; drop != 0; drop &= drop - 1 {
				length[bits.TrailingZeros64(drop)] = int32(i)
			}
			if alive &= m; alive == 0 {
				end = i
				break walk
			}
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		length[bits.TrailingZeros64(alive)] = int32(end)
	}
	for c := range found {
		f := &found[c]
		f.Blocks = int(length[c])
		f.ByTier[TierGPU] = 0
		f.ByTier[TierGPU] = f.Blocks - f.ByTier[TierCPU] - f.ByTier[TierDisk] - f.ByTier[TierOther]
	}
	lookupSink.Add(ahead & 1)
	return dst
}

// liveBit returns b when holder h (of candidate bit b, not a confirmed GPU holder) is
// live at tick now, adding its block to the candidate's tier count when it is below
// GPU and the candidate still matches (b in alive); 0 when h does not count.
func (ix *Index) liveBit(h holder, b, alive uint64, found []Match, now uint32) uint64 {
	switch {
	case h.wf&fSpec != 0: // speculative: GPU until it expires
		if h.wf&fNoExp == 0 && after(now, h.stamp) {
			return 0
		}
	case h.refs == 0:
		return 0
	default: // confirmed, fastest tier below GPU
		if alive&b != 0 {
			found[bits.TrailingZeros64(b)].ByTier[bits.TrailingZeros16(h.refs)/tierBits]++
		}
	}
	return b
}

// lookupGroup is the walk's group size: the slots of 8 keys are found (and the next 8
// home slots loaded) before the group is walked, so their cache misses overlap.
const lookupGroup = 8

// groupMix is the mixes (mix, seed.go) of one group's keys: each key's shard and home
// slot come from it, so it is computed once per key and walk.
type groupMix [lookupGroup]uint64

// touchHome stores into mx the mixes of keys[from:to] and loads their home slots
// (plain loads, no branches, so they overlap); it returns a value derived from them,
// which callers feed to lookupSink so that the compiler keeps the loads.
func (ix *Index) touchHome(keys []Key, from, to int, mx *groupMix) (ahead uint64) {
	for j := from; j < to; j++ {
		m := mix(uint64(keys[j])) // shardOf's (key 0's home is 1's: findGroup)
		mx[j-from] = m
		t := &ix.shards[m>>59].t
		if len(t.s) > 0 {
			ahead += t.s[t.homeOf(m)].k
		}
	}
	return ahead
}

// groupHolders is the holders of one group's keys (shard.holdersAt; nil: key absent).
type groupHolders [lookupGroup][]holder

// findGroup stores into hs the holders of each of keys[g:end] (nil when absent), whose
// mixes are in mx (touchHome), touching each found key's overflow chunk, and returns
// the read-ahead value.
func (ix *Index) findGroup(keys []Key, g, end int, hs *groupHolders, mx *groupMix) (ahead uint64) {
	for j := g; j < end; j++ {
		k, m := uint64(keys[j]), mx[j-g]
		sh := &ix.shards[m>>59]
		if k == 0 { // its shard is mix(0)'s, its slot chain 1's (rhKey)
			k, m = 1, mix(1)
		}
		// ktab.findMixed, inlined: a held key is found by loads and compares alone.
		ts := sh.t.s
		i := -1
		if n := len(ts); n > 0 {
			p := sh.t.homeOf(m)
			for d := 0; ; d++ {
				kk := ts[p].k
				if kk == k {
					i = p
					break
				}
				if kk == 0 || d >= scanFree && sh.t.dist(p) < d {
					break
				}
				if p++; p == n {
					p = 0
				}
			}
		}
		hs[j-g] = nil
		if i >= 0 {
			if h := &ts[i].h; h.wf != 0 {
				hs[j-g] = unsafeOne(h)
			} else {
				c := sh.arena[h.stamp : h.stamp+uint32(h.refs)]
				ahead += uint64(c[0].wf)
				hs[j-g] = c
			}
		}
	}
	return ahead
}
