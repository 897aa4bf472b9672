// Package kvindex keeps, per worker, which token blocks are in its KV cache: block keys
// (chained xxhash over token ids), the prefix index, vLLM KV event decoding, the ZMQ
// subscription and replay. See README.md in this folder.
package kvindex

import (
	"sync"
	"time"
)

// Tier is the storage medium a block is held in (vLLM's BlockStored.medium).
type Tier uint8

const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	TierOther
	NumTiers
)

// Match is one worker's cached leading prefix for a looked-up key chain.
type Match struct {
	Worker string // worker name as registered
	Blocks int    // leading blocks held, in any tier
	// ByTier counts those leading blocks per tier (a block held in several tiers counts
	// in the fastest one). Sum(ByTier) == Blocks.
	ByTier [NumTiers]int
}

// Options configures an Index.
type Options struct {
	// SpeculativeTTL is how long a block booked at pick time stays without a confirming
	// BlockStored event. 0 disables speculative entries.
	SpeculativeTTL time.Duration
	// Now is the clock; nil means time.Now (virtual-time simulations inject their own).
	Now func() time.Time
}

// Index maps block keys to the workers holding them. It is safe for concurrent use.
//
// This first implementation is deliberately simple (maps under one RWMutex); the KV
// index issue replaces its internals, keeping this API.
type Index struct {
	opt Options
	mu  sync.RWMutex
	// guarded by mu
	blocks map[Key]map[string]entry
}

type entry struct {
	tier        Tier
	speculative bool
	expires     time.Time
}

// New returns an empty Index.
func New(opt Options) *Index {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Index{opt: opt, blocks: make(map[Key]map[string]entry)}
}

// Lookup appends to dst, for every worker holding keys[0], how many leading keys it
// holds, and returns dst. It stops walking as soon as no worker matches.
func (ix *Index) Lookup(keys []Key, dst []Match) []Match {
	now := ix.opt.Now()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	base := len(dst)
	for i, k := range keys {
		holders := ix.blocks[k]
		if i == 0 {
			for w, e := range holders {
				if e.speculative && now.After(e.expires) {
					continue
				}
				m := Match{Worker: w, Blocks: 1}
				m.ByTier[e.tier]++
				dst = append(dst, m)
			}
			continue
		}
		alive := 0
		for j := base; j < len(dst); j++ {
			if dst[j].Blocks != i {
				continue
			}
			e, ok := holders[dst[j].Worker]
			if !ok || (e.speculative && now.After(e.expires)) {
				continue
			}
			dst[j].Blocks++
			dst[j].ByTier[e.tier]++
			alive++
		}
		if alive == 0 {
			break
		}
	}
	return dst
}

// Speculate records that worker is about to hold keys (it was just picked for a request
// with these blocks). Entries expire after Options.SpeculativeTTL unless a BlockStored
// event confirms them.
func (ix *Index) Speculate(worker string, keys []Key) {
	if ix.opt.SpeculativeTTL <= 0 {
		return
	}
	exp := ix.opt.Now().Add(ix.opt.SpeculativeTTL)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, k := range keys {
		h := ix.blocks[k]
		if h == nil {
			h = make(map[string]entry, 1)
			ix.blocks[k] = h
		}
		if e, ok := h[worker]; ok && !e.speculative {
			continue
		}
		h[worker] = entry{tier: TierGPU, speculative: true, expires: exp}
	}
}

// Store records confirmed blocks for worker (from a BlockStored event).
func (ix *Index) Store(worker string, tier Tier, keys []Key) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, k := range keys {
		h := ix.blocks[k]
		if h == nil {
			h = make(map[string]entry, 1)
			ix.blocks[k] = h
		}
		h[worker] = entry{tier: tier}
	}
}

// Remove forgets keys for worker (from a BlockRemoved event).
func (ix *Index) Remove(worker string, keys []Key) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, k := range keys {
		if h := ix.blocks[k]; h != nil {
			delete(h, worker)
			if len(h) == 0 {
				delete(ix.blocks, k)
			}
		}
	}
}

// RemoveWorker forgets every block of worker (worker removed, restarted, or cleared).
func (ix *Index) RemoveWorker(worker string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for k, h := range ix.blocks {
		delete(h, worker)
		if len(h) == 0 {
			delete(ix.blocks, k)
		}
	}
}
