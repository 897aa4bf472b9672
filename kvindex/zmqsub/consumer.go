package zmqsub

import (
	"context"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// consumer is the state owned by one worker's consume goroutine. Replays run
// asynchronously: each exchange is its own goroutine owning its DEALER socket, and
// streams what it reads to the consumer (replies), which applies it between live
// frames; the live frames of a rank with a pending replay wait in that rank's reorder
// buffer (pending.buf), so the consumer never stops draining its queue.
type consumer struct {
	s       *workerSub
	ctx     context.Context
	dec     *kvevents.Decoder
	batch   kvevents.Batch
	pubs    map[int]*pubState
	replies chan replayMsg // from replay exchanges, tagged with their id
	// replayers: one goroutine per rank running that rank's exchanges one at a time
	// (at most one replay socket per rank, however often replays are abandoned)
	replayers map[int]*replayer
	wg        sync.WaitGroup // replayer goroutines
	ids       uint64         // last replay id
	// replay backoff of this worker: no replay before replayAfter; replayBackoff is the
	// last wait (doubles per failed replay, 0 after an answered one)
	replayAfter   time.Time
	replayBackoff time.Duration
	// reorder buffer totals over every rank (bounded by ReplayBufferFrames/Bytes)
	bufFrames int
	bufBytes  int64
	pending   int // ranks with a pending replay
}

func newConsumer(ctx context.Context, s *workerSub) *consumer {
	return &consumer{s: s, ctx: ctx, dec: kvevents.NewDecoder(), pubs: map[int]*pubState{}, replies: make(chan replayMsg, 64),
		replayers: map[int]*replayer{}}
}

// close cancels every pending replay and waits for the exchanges to end (each closes
// its socket), then clears the worker's buffer gauges.
func (c *consumer) close() {
	for _, p := range c.pubs {
		if p.pend != nil {
			p.pend.cancel()
		}
	}
	c.wg.Wait()
	c.adjust(-c.pending, -c.bufFrames, -c.bufBytes)
}

func (c *consumer) name() string { return c.s.w.Name }

func (c *consumer) pub(r int) *pubState {
	p := c.pubs[r]
	if p == nil {
		p = &pubState{}
		c.pubs[r] = p
	}
	return p
}

// adjust changes the pending and buffered totals and the worker's gauges by deltas (a
// replaced subscription's consumer may still be closing: its final deltas take only
// its own share off the gauges).
func (c *consumer) adjust(pending, frames int, bytes int64) {
	m := c.s.m.m
	c.pending += pending
	c.bufFrames += frames
	c.bufBytes += bytes
	if pending != 0 {
		m.ReplaysPending.WithLabelValues(c.name()).Add(float64(pending))
	}
	if frames != 0 {
		m.ReplayBufferedFrames.WithLabelValues(c.name()).Add(float64(frames))
	}
	if bytes != 0 {
		m.ReplayBufferedBytes.WithLabelValues(c.name()).Add(float64(bytes))
	}
}

const (
	replayGap     replayKind = iota // a live frame above the next expected seq (the trigger, upto)
	replayCatchUp                   // a publisher's first frame seen (upto): its earlier buffer; never desyncs
	replayResync                    // queued frames were dropped: everything from next on (upto = from)
)

// pending is one rank's replay in flight: what was asked, what the exchange has
// delivered so far (pubState.next advances with the replayed batches), and the live
// frames received meanwhile, in arrival (= seq) order.
type pending struct {
	id         uint64
	kind       replayKind
	cancel     context.CancelFunc
	from, upto uint64
	hole       bool // a replayed batch skipped seqs after the first: the rest is not applied
	resync     bool // queue drops while pending: resync when it ends
	// live frames with seq ≥ liveNext are buffered; a resync replay also skips the
	// duplicates [dupLo, dupHi) of an earlier replay until the first frame is buffered;
	// any other seq went backwards: the publisher restarted.
	liveNext     uint64
	dupLo, dupHi uint64
	buf          []frame
	bytes        int64
}

// handle tracks f's sequence (starting replays of gaps, detecting restarts) and
// applies it, or buffers it behind its rank's pending replay.
func (c *consumer) handle(f frame) {
	m := c.s.m
	if f.reconnected {
		c.reconnected(f.rank)
		return
	}
	if f.restarted {
		m.m.Restarts.WithLabelValues(c.name()).Inc()
		m.log.Info("kvindex: worker restarted; dropping its entries", "worker", c.name())
		for _, p := range c.pubs {
			c.abandonForRestart(p)
		}
		m.ix.ResetWorker(c.name())
		clear(c.pubs) // every rank's next frame is a baseline
		return
	}
	decoded := false
	if f.rank < 0 { // bind mode: the rank is in the payload
		if err := c.dec.Decode(f.payload, &c.batch); err != nil {
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
			return
		}
		f.rank, decoded = c.batch.DPRank, true
	}
	c.live(f, decoded)
}

// live handles one live frame of rank f.rank; decoded: c.batch holds its payload.
func (c *consumer) live(f frame, decoded bool) {
	m := c.s.m
	r := f.rank
	p := c.pub(r)
	if p.pend != nil {
		c.hold(p, f)
		return
	}
	switch {
	case !p.started:
		// The first frame seen from a publisher is a baseline, not a gap: whatever it
		// published before we subscribed (its seq may start at 0 or 1, or we joined
		// late) was never ours to lose. A replay endpoint is asked once for what it
		// still buffers, to learn blocks stored before; its result never desyncs.
		p.started = true
		if f.seq > 0 && c.mayReplay() {
			c.startReplay(r, p, replayCatchUp, 0, f.seq)
			c.hold(p, f)
			return
		}
	case f.seq == p.next:
	case f.seq > p.next:
		m.m.Gaps.WithLabelValues(c.name()).Inc()
		if c.mayReplay() {
			c.startReplay(r, p, replayGap, p.next, f.seq)
			c.hold(p, f)
			return
		}
		c.lost(r, p.next, f.seq, replayFailed, false)
	case f.seq >= p.dupFloor:
		return // already applied from a replay that covered the frame that triggered it
	default:
		// A new publisher, whose first frame seen is a baseline like any other: what it
		// published before, its buffer may still hold.
		c.restarted(r, p, f.seq)
		c.live(f, decoded)
		return
	}
	if !decoded {
		if err := c.dec.Decode(f.payload, &c.batch); err != nil {
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
			decoded = false
		} else {
			decoded = true
		}
	}
	if decoded {
		_ = m.ix.ApplyBatch(c.name(), r, &c.batch)
	}
	p.next = f.seq + 1
	p.dupFloor = p.next
}

// restarted resets rank r after its seq went backwards (a new publisher): its entries
// are dropped and its next frame (the one with seq) is the new publisher's baseline.
func (c *consumer) restarted(r int, p *pubState, seq uint64) {
	m := c.s.m
	m.m.Restarts.WithLabelValues(c.name()).Inc()
	m.log.Info("kvindex: KV event publisher restarted; dropping its entries", "worker", c.name(), "rank", r, "seq", seq, "expected", p.next)
	m.ix.ResetRank(c.name(), r)
	*p = pubState{}
}

// hold buffers live frame f behind p's pending replay, or handles what it reveals: a
// seq that went backwards (restart: the replay is abandoned, the buffer discarded), or
// a full buffer (overflow: the replay is abandoned, the buffer applied).
func (c *consumer) hold(p *pubState, f frame) {
	m := c.s.m
	pd := p.pend
	switch {
	case f.seq >= pd.liveNext:
	case f.seq >= pd.dupLo && f.seq < pd.dupHi:
		return // a duplicate of an earlier replay, still queued
	default:
		c.abandonForRestart(p)
		c.restarted(f.rank, p, f.seq)
		c.live(f, false) // the new publisher's baseline
		return
	}
	n := int64(len(f.payload))
	if c.bufFrames+1 > m.opt.ReplayBufferFrames || c.bufBytes+n > m.opt.ReplayBufferBytes {
		m.m.ReplayBufferOverflows.WithLabelValues(c.name()).Inc()
		m.log.Warn("kvindex: KV event reorder buffer full; abandoning pending replays and applying buffered events",
			"worker", c.name(), "frames", c.bufFrames, "bytes", c.bufBytes,
			"max_frames", m.opt.ReplayBufferFrames, "max_bytes", m.opt.ReplayBufferBytes)
		// every rank's: the bound is the worker's
		for r, q := range c.pubs {
			if q.pend != nil {
				c.finish(r, q, replayAbandoned)
			}
		}
		c.live(f, false)
		return
	}
	pd.buf = append(pd.buf, f)
	pd.bytes += n
	pd.liveNext = f.seq + 1
	pd.dupHi = pd.dupLo // live seqs only grow from here
	c.adjust(0, 1, n)
}

// abandonForRestart cancels p's pending replay (if any) because its publisher
// restarted: the buffered frames are the old engine's, whose entries are reset next,
// so they are discarded (counted), not applied.
func (c *consumer) abandonForRestart(p *pubState) {
	pd := p.pend
	if pd == nil {
		return
	}
	m := c.s.m
	pd.cancel()
	m.m.Replays.WithLabelValues(c.name(), string(replayAbandoned)).Inc()
	m.m.ReplayBufferDiscarded.WithLabelValues(c.name()).Add(float64(len(pd.buf)))
	c.release(p)
}

// release detaches p's pending replay and takes its buffer out of the totals.
func (c *consumer) release(p *pubState) []frame {
	pd := p.pend
	p.pend = nil
	c.adjust(-1, -len(pd.buf), -pd.bytes)
	return pd.buf
}

// reconnected handles rank r's SUB connecting again after it lost its publisher (issue
// 10 item 15): a restarted engine's cache is empty, so the rank's entries are dropped
// at once — the worker may already be healthy again, and its first event can come much
// later — and its next frame is a baseline. (A network blip to the same process loses
// entries that were still valid: fewer predicted hits, never wrong ones.)
func (c *consumer) reconnected(r int) {
	m := c.s.m
	p := c.pubs[r]
	if p == nil || !p.started {
		return // nothing seen from the old connection
	}
	c.abandonForRestart(p)
	m.m.Restarts.WithLabelValues(c.name()).Inc()
	m.log.Info("kvindex: KV event publisher reconnected (restarted); dropping its entries", "worker", c.name(), "rank", r)
	m.ix.ResetRank(c.name(), r)
	delete(c.pubs, r)
}

// hasReplay reports whether the worker has a replay endpoint configured.
func (c *consumer) hasReplay() bool { return c.s.w.KVEvents.ReplayEndpoint != "" }

// mayReplay reports whether a replay may be requested now: the worker has a replay
// endpoint and is not in replay backoff (counted in ReplayBackoffs).
func (c *consumer) mayReplay() bool {
	if !c.hasReplay() {
		return false
	}
	if time.Now().Before(c.replayAfter) {
		c.s.m.m.ReplayBackoffs.WithLabelValues(c.name()).Inc()
		return false
	}
	return true
}

// resyncAll replays every known rank from its next expected seq (after queue drops);
// a rank with a replay pending resyncs when it ends.
func (c *consumer) resyncAll() {
	for r, p := range c.pubs {
		switch {
		case !p.started:
		case p.pend != nil:
			p.pend.resync = true
		default:
			c.resync(r, p)
		}
	}
}

func (c *consumer) resync(r int, p *pubState) {
	if c.mayReplay() {
		c.startReplay(r, p, replayResync, p.next, p.next)
		return
	}
	c.lost(r, p.next, p.next, replayFailed, false)
}

// lost puts the worker in approximate mode after events [from, upto) of rank r could
// not be replayed (Index.Desync).
func (c *consumer) lost(r int, from, upto uint64, res replayResult, attempted bool) {
	m := c.s.m
	m.ix.Desync(c.name()) // before the counter: whoever sees the count sees the mode
	m.log.Warn("kvindex: KV events lost; worker runs approximate until fresh events cover it",
		"worker", c.name(), "rank", r, "from", from, "upto", upto, "replay", res, "attempted", attempted)
}

const (
	replayOK        replayResult = "ok"        // every batch from the requested seq on
	replayPartial   replayResult = "partial"   // the buffer no longer held the requested seq (or held nothing)
	replayFailed    replayResult = "failed"    // timeout or socket error
	replayAbandoned replayResult = "abandoned" // reorder buffer overflow, or the publisher restarted
)

// startReplay starts an asynchronous replay of rank r from seq `from`; upto is the live
// frame that revealed the gap (the caller buffers it next), = from for a resync.
func (c *consumer) startReplay(r int, p *pubState, kind replayKind, from, upto uint64) {
	c.ids++
	ctx, cancel := context.WithCancel(c.ctx)
	pd := &pending{id: c.ids, kind: kind, cancel: cancel, from: from, upto: upto, liveNext: upto}
	if kind == replayResync {
		pd.dupLo, pd.dupHi = p.dupFloor, p.next
	}
	p.pend = pd
	p.next = from
	c.adjust(1, 0, 0)
	emptyOK := kind != replayGap // a resync or catch-up that finds nothing new is fine
	rp := c.replayers[r]
	if rp == nil {
		rp = &replayer{wake: make(chan struct{}, 1)}
		c.replayers[r] = rp
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.s.runReplayer(c.ctx, r, rp, c.replies)
		}()
	}
	rp.submit(&replayReq{ctx: ctx, id: pd.id, from: from, emptyOK: emptyOK})
}

// replayed applies one message from a replay exchange: a batch with seq ≥ p.next in
// order (batches below, an overlapping replay, are skipped), or the exchange's end.
// Messages of an exchange no longer pending (abandoned) are ignored.
func (c *consumer) replayed(rm replayMsg) {
	m := c.s.m
	p := c.pubs[rm.rank]
	if p == nil || p.pend == nil || p.pend.id != rm.id {
		return
	}
	pd := p.pend
	if rm.end {
		c.finish(rm.rank, p, rm.res)
		return
	}
	switch {
	case pd.hole || rm.seq < p.next:
		return // after a hole, or overlap: already applied
	case rm.seq > p.next:
		if !rm.first {
			pd.hole = true // a hole inside the replay
			return
		}
		// The requested seq was already evicted from the replay buffer: apply what
		// remains anyway, fresh events help cover the worker again.
		p.next = rm.seq
	}
	if err := c.dec.Decode(rm.payload, &c.batch); err != nil {
		m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
	} else {
		_ = m.ix.ApplyBatch(c.name(), rm.rank, &c.batch)
	}
	p.next = rm.seq + 1
}

// finish ends rank r's pending replay with res: a gap replay that did not reach its
// trigger puts the worker in approximate mode (a catch-up never does), the backoff
// follows the result, and the buffered live frames are applied in order through the
// ordinary path (a gap among them starts the next replay). Afterwards live frames
// with upto ≤ seq < next were applied from the replay and are duplicates; lower seqs
// mean the publisher restarted.
func (c *consumer) finish(r int, p *pubState, res replayResult) {
	m := c.s.m
	pd := p.pend
	pd.cancel()
	if res == replayOK && pd.hole {
		res = replayPartial
	}
	if res == replayOK && pd.kind == replayGap && p.next < pd.upto {
		res = replayPartial // the buffer ended before the live message
	}
	if c.ctx.Err() == nil {
		switch res {
		case replayFailed, replayAbandoned: // no answer in time: back off
			c.replayBackoff = min(max(2*c.replayBackoff, m.opt.ReplayBackoffMin), m.opt.ReplayBackoffMax)
			c.replayAfter = time.Now().Add(c.replayBackoff)
		default:
			c.replayBackoff, c.replayAfter = 0, time.Time{}
		}
	}
	if res != replayOK && pd.kind != replayCatchUp {
		c.lost(r, pd.from, pd.upto, res, true)
	}
	m.m.Replays.WithLabelValues(c.name(), string(res)).Inc()
	if pd.kind != replayResync {
		p.dupFloor = pd.upto
	} // a resync keeps the floor: duplicates of an earlier replay may still be queued
	if p.next < pd.upto {
		p.next = pd.upto
	}
	for _, f := range c.release(p) {
		c.live(f, false)
	}
	if pd.resync && p.pend == nil && p.started {
		c.resync(r, p)
	}
}

// exchange runs one replay exchange q for rank r on sock (nil: the socket could not be
// made: failed) and sends each replayed batch, then the result, to out, until q.ctx
// ends (the consumer abandoned it or stopped: nothing more is sent). keep: the
// exchange ended at the end marker, sock may serve the next one. Protocol
// (vllm/distributed/kv_events.py ZmqEventPublisher._service_replay): DEALER sends
// ["", seq8]; replies ["", topic, seq8, payload] (vLLM ≥ 0.26) or ["", seq8, payload]
// (older); end marker seq8 = ff…ff with an empty payload. The whole exchange is
// bounded by ReplayTimeout: nothing by then is failed, something partial.
//
// An empty replay is ok when emptyOK (a resync that found nothing new), partial
// otherwise; a first replayed seq above `from` (evicted from the buffer) is partial.
func (s *workerSub) exchange(q *replayReq, r int, sock *zmq.Socket, out chan<- replayMsg) (keep bool) {
	send := func(rm replayMsg) bool {
		rm.id, rm.rank = q.id, r
		select {
		case out <- rm:
			return true
		case <-q.ctx.Done():
			return false
		}
	}
	res, ok, keep := s.replay(q.ctx, sock, q.from, q.emptyOK, func(seq uint64, payload []byte, first bool) bool {
		return send(replayMsg{seq: seq, payload: payload, first: first})
	})
	if ok {
		send(replayMsg{end: true, res: res})
	}
	return keep
}
