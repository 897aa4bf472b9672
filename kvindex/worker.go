package kvindex

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/workers"
)

// WorkerInfo is what the index needs to know about one worker.
type WorkerInfo struct {
	Name string
	// Model is the base model whose namespace the worker's events are keyed in; its
	// block size comes from Options.Models.
	Model string
	// BlockCapacity bounds the worker's speculative entries in approximate mode (LRU);
	// 0 unknown (speculative entries then expire by TTL only).
	BlockCapacity int
	// Events is true when the worker publishes KV events (its mode is exact while they
	// are in sync); false runs it on speculative entries alone.
	Events bool
}

type specEntry struct {
	key   Key
	stamp uint32
}

// worker is one worker's state. mu guards every field below it; the Index's shard
// locks are taken while holding mu, never the reverse.
type worker struct {
	id   uint16
	name string

	mu        sync.Mutex
	info      WorkerInfo
	seedModel string
	blockSize int
	ranks     map[int]*rank
	groups    map[int]bool // group_idx → indexed (learned from BlockStored kinds)
	// speculative entries in insertion order; an entry is dead when its holder's stamp
	// differs (refreshed) or the holder is confirmed or gone.
	fifo     []specEntry
	specLive int // live speculative holders
	nEng     int // engine entries over all ranks
	// tierEng[t]: engine entries with a reference in tier t (over all ranks), kept as
	// references change so that Summary never walks the entries
	tierEng [NumTiers]int

	batches    uint64 // batches applied since creation or reset
	gen        uint32 // bumped by Desync
	desyncGen  uint32 // entries with gen < desyncGen may be stale; 0: in sync
	staleUntil int    // stored blocks needed after a desync to cover the cache
	stored     int    // blocks stored since the last desync
	mismatch   bool   // block size mismatch logged
	// failRun counts the BlockStored events in a row that could not be applied (unknown
	// parent, or fields that disagree); at FailingAfter the worker is failing (not exact)
	// until one applies. failLogged: the failure was logged (once per worker).
	failRun    int
	failing    bool
	failLogged bool
	// lastEvent is when the last batch was applied (zero: never); trafficSince is the
	// first booking after it (zero: none since), for Silent.
	lastEvent    time.Time
	trafficSince time.Time
	lastMode     Mode
	removed      bool
	met          workerMetrics
}

// workerMetrics are w's metric children, resolved once (label lookups cost more than
// applying a small batch).
type workerMetrics struct {
	events                  [5]prometheus.Counter // by kvevents.Type, then skipped
	stored, removed, batchs prometheus.Counter
	lag                     prometheus.Observer
	entries                 prometheus.Gauge
}

func (ix *Index) modelOf(w *workers.Worker) string {
	for _, m := range w.Models {
		if md, ok := ix.specs[m]; ok {
			if md.Base == "" {
				return m
			}
		}
	}
	for _, m := range w.Models {
		if md, ok := ix.specs[m]; ok && md.Base != "" {
			return md.Base
		}
	}
	if len(w.Models) > 0 {
		return w.Models[0]
	}
	return ""
}

// InfoFor derives a WorkerInfo from a registry worker: its base model, block capacity
// and whether it publishes events (bindMode: every worker may, through the bound socket).
func (ix *Index) InfoFor(w *workers.Worker, bindMode bool) WorkerInfo {
	return WorkerInfo{Name: w.Name, Model: ix.modelOf(w), BlockCapacity: w.Profile.BlockCapacity,
		Events: bindMode || w.KVEvents.Endpoint != ""}
}

// SetWorker adds a worker, or updates its info (confirmed entries are dropped when the
// model changes). Speculate and ApplyPayload add unknown workers themselves.
func (ix *Index) SetWorker(info WorkerInfo) {
	ix.wmu.Lock()
	w, ok := ix.byName[info.Name]
	if !ok {
		var id uint16
		if n := len(ix.freeIDs); n > 0 {
			id = ix.freeIDs[n-1]
			ix.freeIDs = ix.freeIDs[:n-1]
		} else {
			if len(ix.byID) > maxID {
				ix.wmu.Unlock()
				ix.log.Error("kvindex: too many workers; worker not indexed", "worker", info.Name, "max", maxID)
				return
			}
			id = uint16(len(ix.byID))
			ix.byID = append(ix.byID, nil)
		}
		w = &worker{id: id, name: info.Name, ranks: map[int]*rank{}, groups: map[int]bool{}}
		m := ix.m
		for t, n := range [...]string{"Unknown", "BlockStored", "BlockRemoved", "AllBlocksCleared", "skipped"} {
			w.met.events[t] = m.Events.WithLabelValues(info.Name, n)
		}
		w.met.stored = m.Blocks.WithLabelValues(info.Name, "stored")
		w.met.removed = m.Blocks.WithLabelValues(info.Name, "removed")
		w.met.batchs = m.Batches.WithLabelValues(info.Name)
		w.met.lag = m.LagSeconds.WithLabelValues(info.Name)
		w.met.entries = m.WorkerEntries.WithLabelValues(info.Name)
		ix.byID[id] = w
		ix.byName[info.Name] = w
		ix.publishNamesLocked()
	}
	ix.wmu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if ok && w.seedModel != info.Model {
		// Confirmed entries were keyed in the old model's namespace; speculative ones
		// come from the router's own keys and stay valid.
		ix.clearLocked(w, -1)
	}
	w.info = info
	w.seedModel = info.Model
	w.blockSize = ix.opt.DefaultBlockSize
	if md, ok := ix.specs[info.Model]; ok {
		w.blockSize = md.BlockSize
	}
	ix.modeLocked(w)
}

func (ix *Index) publishNamesLocked() {
	names := make([]string, len(ix.byID))
	for i, w := range ix.byID {
		if w != nil {
			names[i] = w.name
		}
	}
	ix.names.Store(&names)
}

func (ix *Index) worker(name string) *worker {
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	return ix.byName[name]
}

// WorkerAdded implements workers.Listener for in-process users (simulators) that have
// no subscriber manager: the worker is indexed with events expected when it has a KV
// events endpoint.
func (ix *Index) WorkerAdded(w *workers.Worker) { ix.SetWorker(ix.InfoFor(w, false)) }

// WorkerRemoved implements workers.Listener.
func (ix *Index) WorkerRemoved(w *workers.Worker) { ix.RemoveWorker(w.Name) }

// RemoveWorker forgets every block of worker (worker removed, restarted, or cleared)
// and its metrics series. Unknown workers are ignored.
func (ix *Index) RemoveWorker(name string) {
	ix.wmu.Lock()
	w := ix.byName[name]
	if w == nil {
		ix.wmu.Unlock()
		return
	}
	delete(ix.byName, name)
	ix.wmu.Unlock()
	w.mu.Lock()
	ix.clearLocked(w, -1)
	ix.dropSpecLocked(w)
	w.removed = true
	w.mu.Unlock()
	ix.wmu.Lock()
	ix.byID[w.id] = nil
	ix.freeIDs = append(ix.freeIDs, w.id)
	ix.publishNamesLocked()
	ix.wmu.Unlock()
	ix.m.DeleteWorker(name)
	ix.updateGauges()
}

// Mode returns a worker's index mode (ModeNone for an unknown worker).
func (ix *Index) Mode(name string) Mode {
	w := ix.worker(name)
	if w == nil {
		return ModeNone
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return ix.modeLocked(w)
}

// modeLocked computes w's mode and publishes it when it changed.
func (ix *Index) modeLocked(w *worker) Mode {
	m := ModeNone
	switch {
	case w.desyncGen != 0 || w.failing:
		m = ModeApproximate
	case w.info.Events && w.batches > 0:
		m = ModeExact
	case ix.opt.SpeculativeTTL > 0:
		m = ModeApproximate
	}
	if m != w.lastMode || w.batches <= 1 {
		for i, n := range modeNames {
			v := 0.0
			if Mode(i) == m {
				v = 1
			}
			ix.m.Mode.WithLabelValues(w.name, n).Set(v)
		}
		w.lastMode = m
	}
	return m
}

// noExpiry reports whether w's speculative entries live until evicted by capacity
// rather than by TTL: a worker without events whose capacity is known.
func (w *worker) noExpiry() bool { return !w.info.Events && w.info.BlockCapacity > 0 }

// Speculate records that worker is about to hold keys (it was just picked for a request
// with these blocks). Entries expire after Options.SpeculativeTTL unless a BlockStored
// event confirms them; for a worker without events and a known block capacity they stay
// until evicted (least recently used first) by that capacity. Keys the worker already
// holds are marked used (LRU).
func (ix *Index) Speculate(name string, keys []Key) { ix.book(name, keys, false) }

// book is Speculate; with track it returns the keys whose speculative holder it created
// (for Withdraw).
func (ix *Index) book(name string, keys []Key, track bool) Booking {
	if len(keys) == 0 {
		return Booking{}
	}
	if ix.opt.SpeculativeTTL <= 0 {
		ix.noteTraffic(name)
		return Booking{}
	}
	w := ix.worker(name)
	if w == nil {
		// A worker the index was not told about (in-process users that skip SetWorker):
		// index it without events, so its speculative entries live by TTL.
		ix.SetWorker(WorkerInfo{Name: name})
		if w = ix.worker(name); w == nil {
			return Booking{}
		}
	}
	now := ix.tick()
	w.mu.Lock()
	if w.removed {
		w.mu.Unlock()
		return Booking{}
	}
	ix.trafficLocked(w)
	exp := now + uint32(ix.opt.SpeculativeTTL.Milliseconds())
	flags := uint16(fSpec)
	if w.noExpiry() {
		flags |= fNoExp
		exp = now
	}
	b := Booking{worker: w, stamp: exp}
	// One write lock per shard instead of one per key (a 128-key booking took 128 shard
	// locks, each waiting out any lookup in progress): keys are grouped by shard, each
	// shard's keys applied under one lock; per key, state records whether its holder
	// existed (bit 0) and is speculative after the update (bit 1). Each key is mixed
	// once (its shard and home slot), and the home slot of the key bookAhead places
	// later in the shard's run is loaded before a key is applied, so the table's cache
	// misses overlap (a next turn re-books its whole prompt: 6,250 keys at 100k tokens).
	sc := bookPool.Get().(*bookScratch)
	defer bookPool.Put(sc)
	sc.order, sc.state, sc.mx = grown(sc.order, len(keys)), grown(sc.state, len(keys)), grown(sc.mx, len(keys))
	order, state, mx := sc.order, sc.state, sc.mx
	var start [nShards + 1]int32
	for i, k := range keys {
		m := mix(uint64(k))
		mx[i] = m
		start[m>>59+1]++
	}
	for s := 1; s <= nShards; s++ {
		start[s] += start[s-1]
	}
	fill := start
	for i := len(keys) - 1; i >= 0; i-- { // tail first within each shard, as keys are walked below
		sh := mx[i] >> 59
		order[fill[sh]] = int32(i)
		fill[sh]++
	}
	var cs counts
	var ahead uint64
	for s := 0; s < nShards; s++ {
		if start[s] == start[s+1] {
			continue
		}
		sh := &ix.shards[s]
		run := order[start[s]:start[s+1]]
		sh.mu.Lock()
		for j := range min(bookAhead, len(run)) {
			ahead += sh.t.touch(mx[run[j]])
		}
		for j, i := range run {
			if j+bookAhead < len(run) {
				ahead += sh.t.touch(mx[run[j+bookAhead]])
			}
			k := keys[i]
			slot, h := sh.locateMixed(k, mx[i], w.id)
			switch {
			case h == nil:
				newKey := sh.add(k, slot, holder{wf: w.id | flags, stamp: exp})
				cs.keys += b2i(newKey)
				cs.holders++
				state[i] = 2
			case h.spec():
				h.stamp, h.wf = exp, w.id|flags
				state[i] = 3
			default: // confirmed: marked used (LRU)
				h.stamp = now
				state[i] = 1
			}
		}
		sh.mu.Unlock()
	}
	lookupSink.Add(ahead & 1)
	ix.flush(&cs)
	created, fifo := 0, int64(0)
	// Tail first: the FIFO evicts from its front, and like vLLM (which frees a request's
	// blocks tail first) the prefix should outlive its extensions.
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if state[i]&1 == 0 {
			created++
			if track {
				b.keys = append(b.keys, k)
			}
		}
		if state[i] == 2 { // a new speculative holder (one booked again keeps its entry)
			w.fifo = append(w.fifo, specEntry{k, exp})
			fifo++
		}
	}
	ix.nFIFO.Add(fifo)
	w.specLive += created
	ix.expireLocked(w, now)
	w.mu.Unlock()
	ix.afterWrite()
	return b
}

// bookScratch is book's per-key arrays, pooled (a 6,250-key booking needs 81 KB).
type bookScratch struct {
	order []int32
	state []uint8
	mx    []uint64
}

var bookPool = sync.Pool{New: func() any { return new(bookScratch) }}

// bookAhead is how many keys ahead of the one it applies book loads a home slot.
const bookAhead = 8

// Store records confirmed blocks for worker in tier as if a BlockStored event had
// announced keys with engine hashes equal to the keys themselves (tests, simple
// integrations). It is idempotent: storing a held key again changes nothing (callers
// that need vLLM's reference counts use ApplyPayload/ApplyBatch).
func (ix *Index) Store(name string, tier Tier, keys []Key) {
	w := ix.worker(name)
	if w == nil {
		ix.SetWorker(WorkerInfo{Name: name, Events: true})
		w = ix.worker(name)
	}
	w.mu.Lock()
	r := w.rank(0)
	now := ix.tick()
	var cs counts
	for _, k := range keys {
		if _, e := r.slot(uint64(k)); e.refs[tier] > 0 {
			continue // Store is idempotent: presence, not a reference count
		}
		ix.storeLocked(w, r, uint64(k), k, tier, now, &cs)
	}
	ix.flush(&cs)
	w.batches++
	ix.modeLocked(w)
	w.mu.Unlock()
	ix.afterWrite()
}

// Remove forgets keys stored with Store for worker (every tier).
func (ix *Index) Remove(name string, keys []Key) {
	w := ix.worker(name)
	if w == nil {
		return
	}
	w.mu.Lock()
	r := w.rank(0)
	for _, k := range keys {
		if i, e := r.slot(uint64(k)); i >= 0 {
			ix.releaseLocked(w, r, uint64(k), e)
		}
	}
	w.mu.Unlock()
	ix.updateGauges()
}

func (w *worker) rank(n int) *rank {
	r := w.ranks[n]
	if r == nil {
		r = &rank{}
		w.ranks[n] = r
	}
	return r
}
