package kvindex

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// ErrUnknownWorker is returned by ApplyPayload/ApplyBatch for a worker never added.
var ErrUnknownWorker = errors.New("kvindex: unknown worker")

// ApplyPayload decodes one msgpack event batch exactly as it arrives on the wire (the
// third ZMQ frame) and applies it to worker's data-parallel rank dpRank, in order, with
// no sequence tracking (in-process simulators call it directly). A payload that does
// not decode is counted and dropped whole; the error wraps kvevents.ErrMalformed. A
// decoded event whose fields disagree (kvevents.Event.Err) is counted as the anomaly
// bad_event and skipped; the rest of its batch is applied.
// An unknown worker is added with events expected and the default namespace ("" model).
func (ix *Index) ApplyPayload(worker string, dpRank int, payload []byte) error {
	var b kvevents.Batch
	if err := kvevents.NewDecoder().Decode(payload, &b); err != nil {
		ix.m.DecodeErrors.WithLabelValues(worker).Inc()
		return err
	}
	return ix.ApplyBatch(worker, dpRank, &b)
}

// ApplyBatch applies one decoded batch to worker's rank dpRank.
func (ix *Index) ApplyBatch(name string, dpRank int, b *kvevents.Batch) error {
	w := ix.worker(name)
	if w == nil {
		ix.SetWorker(WorkerInfo{Name: name, Events: true})
		if w = ix.worker(name); w == nil {
			return fmt.Errorf("%w: %s", ErrUnknownWorker, name)
		}
	}
	now := ix.tick()
	w.mu.Lock()
	if w.removed {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrUnknownWorker, name)
	}
	r := w.rank(dpRank)
	var stored, removed, bad int
	var fail failNote
	var byType [5]int // by kvevents.Type, then skipped
	byType[kvevents.TypeUnknown] = b.Unknown
	var cs counts // index-wide counter changes, applied once (flushed before clears)
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Type {
		case kvevents.TypeBlockStored:
			if !ix.kinds[e.SpecKind] {
				w.groups[e.GroupIdx] = false
				byType[4]++
				continue
			}
			w.groups[e.GroupIdx] = true
			if e.Err != nil { // after the kind filter: a skipped group's event is never "bad"
				bad++
				fail.failed(w, "bad_event")
				continue
			}
			n, ok := ix.storedLocked(w, r, e, now, &cs)
			stored += n
			if ok {
				fail.applied(w)
			} else {
				fail.failed(w, "unknown_parent")
			}
		case kvevents.TypeBlockRemoved:
			if ok, known := w.groups[e.GroupIdx]; known && !ok {
				byType[4]++
				continue
			}
			if e.Err != nil {
				bad++
				continue
			}
			t := ParseTier(e.Medium)
			for _, h := range e.BlockHashes {
				if ix.removeLocked(w, r, h.ID, t, &cs) {
					removed++
				} else {
					ix.m.Anomalies.WithLabelValues(w.name, "unknown_removed").Inc()
				}
			}
		case kvevents.TypeAllBlocksCleared:
			ix.flush(&cs)
			ix.clearLocked(w, dpRank)
			// The router's bookings on this worker predicted blocks of the cache that was
			// just reset: they would count as cached until their TTL.
			ix.dropSpecLocked(w)
			if len(w.ranks) <= 1 && w.desyncGen != 0 {
				w.desyncGen = 0 // the whole cache is known again: empty
			}
		}
		byType[e.Type]++
	}
	ix.flush(&cs)
	w.batches++
	w.lastEvent, w.trafficSince = ix.opt.Now(), time.Time{}
	ix.coverLocked(w)
	logFail := fail.settle(w)
	ix.modeLocked(w)
	met := &w.met
	met.entries.Set(float64(w.nEng + w.specLive))
	w.mu.Unlock()

	for t, n := range byType {
		if n > 0 {
			met.events[t].Add(float64(n))
		}
	}
	if stored > 0 {
		met.stored.Add(float64(stored))
	}
	if removed > 0 {
		met.removed.Add(float64(removed))
	}
	if bad > 0 {
		ix.m.Anomalies.WithLabelValues(name, "bad_event").Add(float64(bad))
	}
	met.batchs.Inc()
	if logFail {
		ix.logFailing(name, fail)
	}
	if b.TS > 0 {
		lag := float64(ix.opt.Now().UnixNano())/1e9 - b.TS
		met.lag.Observe(max(lag, 0))
	}
	ix.afterWrite()
	return nil
}

// storedLocked applies one BlockStored and returns the blocks stored; ok is false when
// the event could not be applied (its parent is unknown).
func (ix *Index) storedLocked(w *worker, r *rank, e *kvevents.Event, now uint32, c *counts) (n int, ok bool) {
	if e.BlockSize != w.blockSize {
		ix.m.Anomalies.WithLabelValues(w.name, "block_size_mismatch").Inc()
		if !w.mismatch {
			w.mismatch = true
			ix.log.Warn("kvindex: worker's KV events use another block size than configured; its blocks will not match requests",
				"worker", w.name, "model", w.seedModel, "configured", w.blockSize, "events", e.BlockSize)
		}
	}
	var parent Key
	if e.Parent == nil {
		ns := Namespace{Model: w.seedModel, LoRA: loraNamespace(e)}
		if len(e.ExtraKeys) > 0 {
			ns.CacheSalt = cacheSalt(e.ExtraKeys[0], e.LoRAName)
		}
		parent = ns.Seed()
	} else {
		pe, ok := r.get(e.Parent.ID)
		if !ok {
			ix.m.Anomalies.WithLabelValues(w.name, "unknown_parent").Inc()
			return 0, false
		}
		parent = pe.key
	}
	t := ParseTier(e.Medium)
	bs := e.BlockSize
	for i, h := range e.BlockHashes {
		k := hashBlock(parent, e.TokenIDs[i*bs:(i+1)*bs])
		if i < len(e.ExtraKeys) && e.ExtraKeys[i] != nil {
			k = mixExtra(k, e.ExtraKeys[i], e, e.Parent == nil && i == 0)
		}
		ix.storeLocked(w, r, h.ID, k, t, now, c)
		parent = k
	}
	w.stored += len(e.BlockHashes)
	return len(e.BlockHashes), true
}

// storeLocked adds one reference of (rank, engine hash eh) → k in tier t.
func (ix *Index) storeLocked(w *worker, r *rank, eh uint64, k Key, t Tier, now uint32, c *counts) {
	i, at, d := r.t.probe(eh)
	var e engEntry
	if i >= 0 {
		if e = unpack(r.t.a[i], r.t.b[i]); e.key != k {
			// The engine reused a hash for other content (hash collision or a restart
			// we missed): the old mapping is gone.
			ix.releaseLocked(w, r, eh, e)
			i, at, e = -1, -1, engEntry{}
		}
	}
	if i < 0 {
		e = engEntry{key: k}
		w.nEng++
		ix.count(c, 0, 0, 1)
	}
	e.gen = uint8(w.gen)
	first := e.refs[t] == 0
	if first {
		w.tierEng[t]++
	}
	e.refs[t] = min(e.refs[t]+1, 15)
	if i < 0 { // one probe: insert where the lookup stopped (at < 0: from the home slot)
		r.t.insertAt(eh, e.key, packMeta(e), at, d)
	} else {
		r.setAt(i, eh, e)
	}
	if ix.confirm(k, w.id, t, first, now, c) { // a confirming store replaces a speculative entry
		w.specLive--
	}
}

// removeLocked releases one reference of (rank, eh) in tier t and reports whether the
// hash was known.
func (ix *Index) removeLocked(w *worker, r *rank, eh uint64, t Tier, c *counts) bool {
	i, e := r.slot(eh)
	if i < 0 {
		return false
	}
	if e.refs[t] == 0 {
		// removed from a tier we never saw it stored in: release the first held tier
		for tt := Tier(0); tt < NumTiers; tt++ {
			if e.refs[tt] > 0 {
				t = tt
				break
			}
		}
	}
	e.refs[t]--
	if e.refs[t] == 0 {
		w.tierEng[t]--
		ix.unref(e.key, w.id, t, c)
	}
	if e.refs == [NumTiers]uint8{} {
		r.t.del(i)
		w.nEng--
		ix.count(c, 0, 0, -1)
	} else {
		r.setAt(i, eh, e)
	}
	return true
}

// releaseLocked drops every reference of (rank, eh).
func (ix *Index) releaseLocked(w *worker, r *rank, eh uint64, e engEntry) {
	ix.unrefAll(w, e)
	r.del(eh)
	w.nEng--
	ix.nEng.Add(-1)
}

func (ix *Index) unrefAll(w *worker, e engEntry) {
	for t := Tier(0); t < NumTiers; t++ {
		if e.refs[t] > 0 {
			w.tierEng[t]--
			ix.unref(e.key, w.id, t, nil)
		}
	}
}

// clearLocked drops the confirmed entries of one rank (dpRank ≥ 0) or of all ranks.
func (ix *Index) clearLocked(w *worker, dpRank int) {
	for n, r := range w.ranks {
		if dpRank >= 0 && n != dpRank {
			continue
		}
		for _, it := range r.items(0, -1) {
			ix.unrefAll(w, it.e)
		}
		w.nEng -= r.len()
		ix.nEng.Add(-int64(r.len()))
		r.clear()
	}
}

// dropSpecLocked removes every speculative holder of w.
func (ix *Index) dropSpecLocked(w *worker) {
	for _, s := range w.fifo {
		ix.update(s.key, w.id, nil, func(h *holder) bool { return !h.spec() })
	}
	ix.nFIFO.Add(-int64(len(w.fifo)))
	w.fifo = nil
	w.specLive = 0
}

// expireLocked pops dead, expired and over-capacity speculative entries from the front
// of w's FIFO (insertion order = expiry order, as every entry gets the same TTL; for
// capacity-bound workers, a block booked again moves to the back when its place comes
// due, so the front is least recently used).
func (ix *Index) expireLocked(w *worker, now uint32) {
	limit := -1
	if w.noExpiry() {
		limit = w.info.BlockCapacity
	}
	popped, expired, evicted := 0, 0, 0
	for popped < len(w.fifo) {
		s := w.fifo[popped]
		h, ok := ix.peek(s.key, w.id)
		if ok && h.spec() {
			over := limit >= 0 && w.specLive > limit
			exp := h.wf&fNoExp == 0 && after(now, h.stamp)
			// A holder booked again keeps its first place in the FIFO (booking does not
			// push it twice); when that place comes due it moves to the back with the
			// stamp of its last booking.
			stale := h.stamp != s.stamp
			if !over && !exp && !(stale && h.wf&fNoExp == 0 && after(now, s.stamp)) {
				break
			}
			if stale && !exp {
				w.fifo = append(w.fifo, specEntry{s.key, h.stamp})
				ix.nFIFO.Add(1)
				popped++
				continue
			}
			stamp := h.stamp
			ix.update(s.key, w.id, nil, func(h *holder) bool { return !(h.spec() && h.stamp == stamp) })
			w.specLive--
			if exp {
				expired++
			} else {
				evicted++
			}
		}
		popped++
	}
	if popped > 0 {
		w.fifo = append(w.fifo[:0], w.fifo[popped:]...)
		ix.nFIFO.Add(-int64(popped))
	}
	// Re-speculation leaves dead entries behind; compact when they dominate.
	if len(w.fifo) > 1024 && len(w.fifo) > 4*w.specLive {
		live := w.fifo[:0]
		for _, s := range w.fifo {
			if h, ok := ix.peek(s.key, w.id); ok && h.spec() {
				live = append(live, s)
			}
		}
		ix.nFIFO.Add(int64(len(live) - len(w.fifo)))
		w.fifo = live
	}
	if expired > 0 {
		ix.m.Evictions.WithLabelValues("expired").Add(float64(expired))
	}
	if evicted > 0 {
		ix.m.Evictions.WithLabelValues("capacity").Add(float64(evicted))
	}
}

// ResetRank forgets what worker's rank dpRank stored: the publisher restarted (its
// sequence went backwards), so its engine hashes and cache are new.
func (ix *Index) ResetRank(name string, dpRank int) {
	w := ix.worker(name)
	if w == nil {
		return
	}
	w.mu.Lock()
	ix.clearLocked(w, dpRank)
	delete(w.ranks, dpRank)
	ix.modeLocked(w)
	w.mu.Unlock()
	ix.updateGauges()
}

// ResetWorker forgets what worker's engine stored on every rank, and its speculative
// entries: the worker restarted, its cache is empty. The worker stays indexed.
func (ix *Index) ResetWorker(name string) {
	w := ix.worker(name)
	if w == nil {
		return
	}
	w.mu.Lock()
	ix.clearLocked(w, -1)
	clear(w.ranks)
	ix.dropSpecLocked(w)
	w.desyncGen = 0
	ix.modeLocked(w)
	met := w.met.entries
	w.mu.Unlock()
	met.Set(0)
	ix.updateGauges()
}

// Desync marks worker's entries as possibly stale: events were lost and could not be
// replayed. The worker runs approximate (its entries still count) until fresh
// BlockStored events have covered its cache again — as many blocks as its capacity (or, when
// unknown, as it held at the desync but at least DefaultCoverBlocks) — or an AllBlocksCleared
// resets it; then the entries not refreshed since the desync are dropped.
func (ix *Index) Desync(name string) {
	w := ix.worker(name)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	w.desyncGen = w.gen
	w.stored = 0
	w.staleUntil = w.info.BlockCapacity
	if w.staleUntil <= 0 {
		// Unknown capacity: what it held, but at least a small cache's worth, since
		// the lost messages may have stored blocks we never saw.
		w.staleUntil = max(w.nEng, DefaultCoverBlocks)
	}
	ix.modeLocked(w)
}

// DefaultCoverBlocks is how many fresh blocks cover a desynced worker whose block
// capacity is unknown and which held fewer entries than that.
const DefaultCoverBlocks = 1024

// coverLocked ends a desync once enough fresh blocks were stored.
func (ix *Index) coverLocked(w *worker) {
	if w.desyncGen == 0 || w.stored < w.staleUntil {
		return
	}
	for _, r := range w.ranks {
		for _, it := range r.items(0, -1) {
			if it.e.gen != uint8(w.gen) { // not stored since the desync (gen wraps after 256 desyncs)
				ix.releaseLocked(w, r, it.eh, it.e)
			}
		}
	}
	w.desyncGen = 0
}

// hashBlock is HashBlocks for exactly one block.
func hashBlock(parent Key, tokens []uint32) Key {
	var buf [8 + 4*64]byte
	if len(tokens) > 64 {
		return HashBlocks(parent, tokens, len(tokens), nil)[0]
	}
	b := buf[:8+4*len(tokens)]
	putKeyTokens(b, parent, tokens)
	return Key(xxhash.Sum64(b))
}

// loraNamespace is the adapter part of a chain's namespace: the event's lora_name, as
// requests name the adapter in their model field. vLLM versions whose BlockStored
// carries only lora_id (no lora_name) get "lora_id:<id>", a namespace no request's keys
// fall in: their adapter blocks then match nothing, rather than match requests for the
// base model with the same tokens (vLLM itself never shares those blocks: the adapter
// is in their block hash).
func loraNamespace(e *kvevents.Event) string {
	if e.LoRAName != "" || e.LoRAID == nil || *e.LoRAID == 0 {
		return e.LoRAName
	}
	return "lora_id:" + strconv.FormatInt(*e.LoRAID, 10)
}

// isAdapterKey reports whether a block's first extra key is the event's adapter: its
// lora_name, or the lora_id older vLLM hashed instead.
func isAdapterKey(x any, e *kvevents.Event) bool {
	switch v := x.(type) {
	case string:
		return e.LoRAName != "" && v == e.LoRAName
	case nil:
		return false
	}
	id, ok := asInt(x)
	return ok && e.LoRAID != nil && *e.LoRAID != 0 && id == *e.LoRAID
}

// asInt converts a decoded msgpack integer of any width to int64.
func asInt(x any) (int64, bool) {
	switch v := x.(type) {
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v), true
		}
	}
	return 0, false
}

// cacheSalt extracts vLLM's cache_salt from the first block's extra keys: vLLM
// appends it last, after the LoRA name and multimodal hashes
// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys).
func cacheSalt(extra any, lora string) string {
	xs, ok := extra.([]any)
	if !ok || len(xs) == 0 {
		return ""
	}
	if s, ok := xs[len(xs)-1].(string); ok && !(len(xs) == 1 && s == lora) {
		return s
	}
	return ""
}

// mixExtra folds a block's extra keys other than the LoRA name and the cache salt
// (multimodal or prompt-embeds hashes) into its key, so that such blocks and their
// descendants never match token-only request keys.
//
// vLLM puts the request's adapter first in every block's extra keys: its lora_name
// in current versions, its lora_int_id in older ones
// (vllm/v1/core/kv_cache_utils.py _gen_lora_extra_hash_keys); either is the adapter
// already in the namespace, not content, and is skipped.
func mixExtra(k Key, extra any, e *kvevents.Event, first bool) Key {
	xs, ok := extra.([]any)
	if !ok {
		return k
	}
	rest := xs
	if len(rest) > 0 && isAdapterKey(rest[0], e) {
		rest = rest[1:]
	}
	if first && len(rest) > 0 {
		if _, ok := rest[len(rest)-1].(string); ok {
			rest = rest[:len(rest)-1] // the cache salt, already in the namespace
		}
	}
	if len(rest) == 0 {
		return k
	}
	d := xxhash.New()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(k) >> (8 * i))
	}
	_, _ = d.Write(b[:])
	_, _ = fmt.Fprint(d, rest...)
	return Key(d.Sum64())
}
