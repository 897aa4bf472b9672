// Package kvindex keeps, per worker, which token blocks are in its KV cache: block keys
// (chained xxhash over token ids), the prefix index, vLLM KV event decoding, the ZMQ
// subscription and replay. See README.md in this folder.
package kvindex

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/metrics"
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

var tierNames = [NumTiers]string{"GPU", "CPU", "Disk", "other"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return "other"
}

// ParseTier maps a BlockStored/BlockRemoved medium to a tier: nil/"" and "GPU" are GPU,
// "CPU" CPU, "DISK" Disk (any case), anything else other.
func ParseTier(medium string) Tier {
	switch medium {
	case "", "GPU", "gpu", "Gpu":
		return TierGPU
	case "CPU", "cpu", "Cpu":
		return TierCPU
	case "DISK", "disk", "Disk":
		return TierDisk
	}
	return TierOther
}

// Match is one worker's cached leading prefix for a looked-up key chain.
type Match struct {
	Worker string // worker name as registered
	Blocks int    // leading blocks held, in any tier
	// ByTier counts those leading blocks per tier (a block held in several tiers counts
	// in the fastest one). Sum(ByTier) == Blocks.
	ByTier [NumTiers]int
}

// Mode is how much the index knows about one worker.
type Mode uint8

const (
	// ModeNone: nothing (no events and speculation disabled).
	ModeNone Mode = iota
	// ModeApproximate: speculative entries only (no events configured, none received
	// yet), or events out of sync (replay impossible or incomplete) until fresh events
	// have covered the worker's cache again.
	ModeApproximate
	// ModeExact: events in sync.
	ModeExact
)

var modeNames = [...]string{"none", "approximate", "exact"}

func (m Mode) String() string { return modeNames[m] }

// Model is what the index needs to know about one served model.
type Model struct {
	Name      string // served model name
	Base      string // base model when Name is a LoRA adapter; "" for a base model
	BlockSize int    // tokens per block; 0 means Options.DefaultBlockSize
}

// Options configures an Index. Zero values take the documented defaults.
type Options struct {
	// SpeculativeTTL is how long a block booked at pick time stays without a confirming
	// BlockStored event. 0 disables speculative entries (and with them approximate mode
	// for workers without events).
	SpeculativeTTL time.Duration
	// MaxBytes caps the index's estimated memory; when reached, the least recently used
	// entries are evicted (sampled LRU, see README). 0 means no cap.
	MaxBytes int64
	// Models lists served models: a worker's events are keyed in the namespace of its
	// base model, with the block size configured here (confirmed by events).
	Models []Model
	// DefaultBlockSize is the block size of models not in Models. 0 means 16 (vLLM's).
	DefaultBlockSize int
	// SpecKinds are the kv_cache_spec_kind values whose groups are indexed. nil means
	// {"full_attention"}. Events without a kind (older vLLM) are always indexed.
	SpecKinds []string
	Metrics   *metrics.Index   // nil: unregistered metrics
	Logger    *slog.Logger     // nil: slog.Default()
	Now       func() time.Time // nil: time.Now (virtual-time simulations inject their own)
}

// Index maps block keys to the workers holding them. It is safe for concurrent use.
//
// Layout (README.md has the details and measurements): block key → holder set in
// nShards maps, each under its own RWMutex; per worker, per data-parallel rank,
// engine hash → key with reference counts. Workers are interned to small ids.
// Lock order: a worker's mu before shard locks; shard locks in increasing index order
// (Lookup read-locks them all, writers lock one at a time). Never two workers' mu.
type Index struct {
	opt   Options
	m     *metrics.Index
	log   *slog.Logger
	base  time.Time // tick origin
	kinds map[string]bool
	specs map[string]Model

	shards [nShards]shard

	wmu     sync.Mutex               // guards byName, byID, freeIDs
	byName  map[string]*worker       //
	byID    []*worker                // index = worker id; nil = free
	freeIDs []uint16                 //
	names   atomic.Pointer[[]string] // id → name, copy-on-write for lock-free Lookup

	// counters for memory accounting, updated atomically by writers
	nKeys, nHolders, nEng, nFIFO atomic.Int64
	evictCursor                  atomic.Uint32
}

// DefaultBlockSize is the KV block size, in tokens, of a model whose Options give none:
// vLLM's default --block-size (16) on GPUs.
const DefaultBlockSize = 16

// New returns an empty Index.
func New(opt Options) *Index {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.DefaultBlockSize <= 0 {
		opt.DefaultBlockSize = DefaultBlockSize
	}
	if opt.SpecKinds == nil {
		opt.SpecKinds = []string{"full_attention"}
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered().Index
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	ix := &Index{opt: opt, m: opt.Metrics, log: opt.Logger, base: opt.Now(), kinds: map[string]bool{"": true},
		specs: map[string]Model{}, byName: map[string]*worker{}, byID: []*worker{nil}}
	for _, k := range opt.SpecKinds {
		ix.kinds[k] = true
	}
	for _, md := range opt.Models {
		if md.BlockSize <= 0 {
			md.BlockSize = opt.DefaultBlockSize
		}
		ix.specs[md.Name] = md
	}
	ix.names.Store(&[]string{""})
	return ix
}

// lookupSink keeps the compiler from dropping Lookup's read-ahead loads.
var lookupSink atomic.Uint64

// tick is now in milliseconds since the index was created, wrapping after 49 days;
// compare ticks with after().
func (ix *Index) tick() uint32 { return uint32(ix.opt.Now().Sub(ix.base) / time.Millisecond) }

// after reports whether tick a is later than b (valid for |a−b| < 24 days).
func after(a, b uint32) bool { return int32(a-b) > 0 }

// Lookup appends to dst, for every worker holding keys[0], how many leading keys it
// holds, and returns dst. It stops walking as soon as no worker matches. Speculative
// entries count as GPU blocks until they expire.
//
// Cost: one map probe per key walked plus one step per holder of that key; all shards
// are read-locked for the duration (in index order), so writers wait at most one
// lookup.
func (ix *Index) Lookup(keys []Key, dst []Match) []Match {
	if len(keys) == 0 {
		return dst
	}
	now := ix.tick()
	names := *ix.names.Load()
	for i := range ix.shards {
		ix.shards[i].mu.RLock()
	}
	defer func() {
		for i := range ix.shards {
			ix.shards[i].mu.RUnlock()
		}
	}()
	base := len(dst)
	// cnt[id] is worker id's leading blocks so far (−1: not a candidate), pos[id] its
	// index in dst[base:]. A holder that cannot advance costs one load and compare.
	var cntBuf, posBuf [128]int32
	var cnt, pos []int32
	var wide *wideBufs
	if len(names) <= len(cntBuf) { // ids are dense: up to 127 workers need no allocation
		cnt, pos = cntBuf[:len(names)], posBuf[:len(names)]
	} else {
		wide = widePool.Get().(*wideBufs)
		defer widePool.Put(wide)
		wide.cnt, wide.pos = grown(wide.cnt, len(names)), grown(wide.pos, len(names))
		cnt, pos = wide.cnt, wide.pos
	}
	for i := range cnt {
		cnt[i] = -1
	}
	k0 := keys[0]
	sh := &ix.shards[shardOf(k0)]
	_, hs0 := sh.holders(k0)
	for _, h := range hs0 {
		if t, ok := h.live(now); ok && int(h.id()) < len(cnt) {
			m := Match{Worker: names[h.id()], Blocks: 1}
			m.ByTier[t] = 1
			cnt[h.id()], pos[h.id()] = 1, int32(len(dst)-base)
			dst = append(dst, m)
		}
	}
	found := dst[base:]
	if len(found) == 0 {
		return dst
	}
	if len(found) <= 64 {
		return ix.walkSet(keys, found, cnt, pos, dst, now, wide)
	}
	// Keys are processed in groups of 8: first every key's slot is found and its
	// overflow chunk touched (independent loads, so the cache misses of 8 keys overlap
	// instead of being paid one by one), then the group is walked.
	var hs groupHolders
	var mx [2]groupMix // this group's keys' mixes and the next's
	ahead := ix.touchHome(keys, 1, min(1+lookupGroup, len(keys)), &mx[0])
	for g, cur := 1, 0; g < len(keys); g, cur = g+lookupGroup, cur^1 {
		end := min(g+lookupGroup, len(keys))
		ahead += ix.touchHome(keys, end, min(end+lookupGroup, len(keys)), &mx[cur^1]) // the next group loads while this one is walked
		ahead += ix.findGroup(keys, g, end, &hs, &mx[cur])
		for i := g; i < end; i++ {
			if hs[i-g] == nil {
				return finish(found, cnt, pos, dst, ahead)
			}
			advanced := 0
			for _, h := range hs[i-g] {
				id := int(h.wf & idMask)
				if id >= len(cnt) || cnt[id] != int32(i) {
					continue
				}
				if t, ok := h.live(now); ok {
					cnt[id]++
					found[pos[id]].ByTier[t]++
					advanced++
				}
			}
			if advanced == 0 {
				return finish(found, cnt, pos, dst, ahead)
			}
		}
	}
	return finish(found, cnt, pos, dst, ahead)
}

// finish copies each candidate's count into its Match.
func finish(found []Match, cnt, pos []int32, dst []Match, ahead uint64) []Match {
	for id, c := range cnt {
		if c > 0 {
			found[pos[id]].Blocks = int(c)
		}
	}
	lookupSink.Add(ahead & 1)
	return dst
}
