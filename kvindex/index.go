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
	nKeys, nHolders, nMore, nEng, nFIFO atomic.Int64
	evictCursor                         atomic.Uint32
}

// New returns an empty Index.
func New(opt Options) *Index {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.DefaultBlockSize <= 0 {
		opt.DefaultBlockSize = 16
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
	for i := range ix.shards {
		ix.shards[i].m = make(map[Key]hset)
	}
	ix.names.Store(&[]string{""})
	return ix
}

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
	hs, ok := ix.shards[shardOf(keys[0])].m[keys[0]]
	if !ok {
		return dst
	}
	hs.each(func(h holder) bool {
		if t, ok := h.live(now); ok {
			m := Match{Worker: names[h.id()], Blocks: 1}
			m.ByTier[t] = 1
			dst = append(dst, m)
		}
		return true
	})
	found := dst[base:]
	if len(found) == 0 || len(keys) == 1 {
		return dst
	}
	// pos maps worker id → index in found; small worker sets scan linearly.
	ids := make([]uint16, 0, len(found))
	hs.each(func(h holder) bool {
		if _, ok := h.live(now); ok {
			ids = append(ids, h.id())
		}
		return true
	})
	var pos []int32
	if len(ids) > 8 {
		pos = make([]int32, len(names))
		for i := range pos {
			pos[i] = -1
		}
		for j, id := range ids {
			pos[id] = int32(j)
		}
	}
	find := func(id uint16) int {
		if pos != nil {
			if int(id) < len(pos) {
				return int(pos[id])
			}
			return -1
		}
		for j, x := range ids {
			if x == id {
				return j
			}
		}
		return -1
	}
	for i := 1; i < len(keys); i++ {
		k := keys[i]
		hs, ok := ix.shards[shardOf(k)].m[k]
		if !ok {
			break
		}
		advanced := 0
		hs.each(func(h holder) bool {
			j := find(h.id())
			if j < 0 || found[j].Blocks != i {
				return true
			}
			if t, ok := h.live(now); ok {
				found[j].Blocks++
				found[j].ByTier[t]++
				advanced++
			}
			return true
		})
		if advanced == 0 {
			break
		}
	}
	return dst
}
