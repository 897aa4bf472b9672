package zmqsub

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// consumer is the state owned by one worker's consume goroutine.
type consumer struct {
	s       *workerSub
	dec     *kvevents.Decoder
	batch   kvevents.Batch
	pubs    map[int]*pubState
	dealers map[int]*zmq.Socket // replay sockets by rank
	// recovered: a replay ran while handling the current frame (and reused batch)
	recovered bool
	// replay backoff of this worker: no replay before replayAfter; replayBackoff is the
	// last wait (doubles per failed replay, 0 after an answered one)
	replayAfter   time.Time
	replayBackoff time.Duration
}

func (c *consumer) close() {
	for r, d := range c.dealers {
		d.Close()
		delete(c.dealers, r)
	}
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

// handle tracks f's sequence (replaying gaps, detecting restarts) and applies it.
func (c *consumer) handle(ctx context.Context, f frame) {
	m := c.s.m
	if f.reconnected {
		c.reconnected(f.rank)
		return
	}
	if f.restarted {
		m.m.Restarts.WithLabelValues(c.name()).Inc()
		m.log.Info("kvindex: worker restarted; dropping its entries", "worker", c.name())
		m.ix.ResetWorker(c.name())
		clear(c.pubs) // every rank's next frame is a baseline
		return
	}
	c.recovered = false
	err := c.dec.Decode(f.payload, &c.batch) // whole payload, before anything is applied
	r := f.rank
	if r < 0 { // bind mode: the rank is in the payload
		if err != nil {
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
			return
		}
		r = c.batch.DPRank
	}
	p := c.pub(r)
	switch {
	case !p.started:
		// The first frame seen from a publisher is a baseline, not a gap: whatever it
		// published before we subscribed (its seq may start at 0 or 1, or we joined
		// late) was never ours to lose. A replay endpoint is asked once for what it
		// still buffers, to learn blocks stored before; its result never desyncs.
		p.started = true
		if f.seq > 0 && c.hasReplay() {
			c.catchUp(ctx, r, p, f.seq)
		}
	case f.seq == p.next:
	case f.seq > p.next:
		m.m.Gaps.WithLabelValues(c.name()).Inc()
		c.recover(ctx, r, p, p.next, f.seq)
	case f.seq >= p.dupFloor:
		return // already applied from a replay that covered the frame that triggered it
	default:
		m.m.Restarts.WithLabelValues(c.name()).Inc()
		m.log.Info("kvindex: KV event publisher restarted; dropping its entries", "worker", c.name(), "rank", r, "seq", f.seq, "expected", p.next)
		m.ix.ResetRank(c.name(), r)
		*p = pubState{started: true}
		if f.seq > 0 && c.hasReplay() {
			// A new publisher, whose first frame seen is a baseline like any other: what
			// it published before, its buffer may still hold.
			c.catchUp(ctx, r, p, f.seq)
		}
	}
	if f.seq < p.next {
		return // the replay covered it
	}
	if c.recovered { // recover reused the batch: decode again
		err = c.dec.Decode(f.payload, &c.batch)
	}
	if err != nil {
		m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
	} else {
		_ = m.ix.ApplyBatch(c.name(), r, &c.batch)
	}
	p.next = f.seq + 1
	p.dupFloor = p.next
}

// reconnected handles rank r's SUB connecting again after it lost its publisher (issue
// 10 item 15): a restarted engine's cache is empty, so the rank's entries are dropped
// at once — the worker may already be healthy again, and its first event can come much
// later — and its next frame is a baseline. (A network blip to the same process loses
// entries that were still valid: fewer predicted hits, never wrong ones.)
func (c *consumer) reconnected(r int) {
	m := c.s.m
	if p := c.pubs[r]; p == nil || !p.started {
		return // nothing seen from the old connection
	}
	m.m.Restarts.WithLabelValues(c.name()).Inc()
	m.log.Info("kvindex: KV event publisher reconnected (restarted); dropping its entries", "worker", c.name(), "rank", r)
	m.ix.ResetRank(c.name(), r)
	delete(c.pubs, r)
}

// hasReplay reports whether the worker has a replay endpoint configured.
func (c *consumer) hasReplay() bool { return c.s.w.KVEvents.ReplayEndpoint != "" }

// resyncAll replays every known rank from its next expected seq (after queue drops).
func (c *consumer) resyncAll(ctx context.Context) {
	for r, p := range c.pubs {
		if p.started {
			c.recover(ctx, r, p, p.next, p.next)
		}
	}
}

// replayResult classes one replay exchange.
type replayResult string

const (
	replayOK      replayResult = "ok"      // every batch from the requested seq on
	replayPartial replayResult = "partial" // the buffer no longer held the requested seq (or held nothing)
	replayFailed  replayResult = "failed"  // timeout or socket error
)

// recover replays [from, upto) of rank r (upto: the live frame that revealed the gap,
// not applied here) and applies what it gets. A partial or failed replay, no replay
// endpoint, or a replay endpoint in backoff put the worker in approximate mode
// (Index.Desync). Afterwards live frames with upto ≤ seq < next were applied from the
// replay and are duplicates; lower seqs mean the publisher restarted.
func (c *consumer) recover(ctx context.Context, r int, p *pubState, from, upto uint64) {
	m := c.s.m
	p.next = from
	res, tried := c.replayRange(ctx, r, p, from, upto == from)
	if res == replayOK && p.next < upto {
		res = replayPartial // the buffer ended before the live message
	}
	if res != replayOK {
		m.ix.Desync(c.name()) // before the counter: whoever sees the count sees the mode
		m.log.Warn("kvindex: KV events lost; worker runs approximate until fresh events cover it",
			"worker", c.name(), "rank", r, "from", from, "upto", upto, "replay", res, "attempted", tried)
	}
	if tried {
		m.m.Replays.WithLabelValues(c.name(), string(res)).Inc()
	}
	p.dupFloor = upto
	if p.next < upto {
		p.next = upto
	}
}

// catchUp replays what rank r's buffer holds before its first live frame (seq upto);
// whatever it gets or misses, the worker stays in sync (the first frame is a baseline).
func (c *consumer) catchUp(ctx context.Context, r int, p *pubState, upto uint64) {
	m := c.s.m
	p.next = 0
	res, tried := c.replayRange(ctx, r, p, 0, true)
	if tried {
		m.m.Replays.WithLabelValues(c.name(), string(res)).Inc()
	}
	p.dupFloor = upto
	if p.next < upto {
		p.next = upto
	}
}

// replayRange runs one replay exchange from seq `from` (unless the worker has no replay
// endpoint or is in replay backoff: tried false) and applies each replayed batch with
// seq ≥ p.next in order, advancing p.next. Batches below p.next (a replay overlapping
// what was applied) are skipped. The backoff doubles on failure and resets on an
// answer.
func (c *consumer) replayRange(ctx context.Context, r int, p *pubState, from uint64, emptyOK bool) (replayResult, bool) {
	m := c.s.m
	c.recovered = true
	if !c.hasReplay() {
		return replayFailed, false
	}
	if now := time.Now(); now.Before(c.replayAfter) {
		m.m.ReplayBackoffs.WithLabelValues(c.name()).Inc()
		return replayFailed, false
	}
	res := c.replay(ctx, r, from, emptyOK, func(seq uint64, payload []byte, first bool) bool {
		if seq < p.next {
			return true // overlap: already applied
		}
		if seq > p.next {
			if !first {
				return false // a hole inside the replay
			}
			// The requested seq was already evicted from the replay buffer: apply what
			// remains anyway, fresh events help cover the worker again.
			p.next = seq
		}
		if err := c.dec.Decode(payload, &c.batch); err != nil {
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
		} else {
			_ = m.ix.ApplyBatch(c.name(), r, &c.batch)
		}
		p.next = seq + 1
		return true
	})
	if res == replayFailed && ctx.Err() == nil {
		c.replayBackoff = min(max(2*c.replayBackoff, m.opt.ReplayBackoffMin), m.opt.ReplayBackoffMax)
		c.replayAfter = time.Now().Add(c.replayBackoff)
	} else {
		c.replayBackoff, c.replayAfter = 0, time.Time{}
	}
	return res, true
}

var errReplayTimeout = errors.New("replay timed out")

// replay asks rank r's replay endpoint for every buffered batch from seq `from` on and
// passes each to got, in order, until the end marker; got returns false at a hole.
// Protocol (vllm/distributed/kv_events.py ZmqEventPublisher._service_replay): DEALER
// sends ["", seq8]; replies ["", topic, seq8, payload] (vLLM ≥ 0.26) or ["", seq8,
// payload] (older); end marker seq8 = ff…ff with an empty payload.
//
// An empty replay is ok when emptyOK (a resync that found nothing new), partial otherwise.
func (c *consumer) replay(ctx context.Context, r int, from uint64, emptyOK bool, got func(seq uint64, payload []byte, first bool) bool) replayResult {
	m := c.s.m
	ep := c.s.w.KVEvents.ReplayEndpoint
	sock, err := c.dealer(r, EndpointForRank(ep, r))
	if err != nil {
		return replayFailed
	}
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], from)
	if _, err := sock.SendMessage("", seq8[:]); err != nil {
		c.dropDealer(r)
		return replayFailed
	}
	deadline := time.Now().Add(m.opt.ReplayTimeout)
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	first, hole := true, false
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			c.dropDealer(r) // late replies must not reach the next exchange
			if first {
				return replayFailed
			}
			return replayPartial
		}
		ps, err := poller.Poll(min(left, m.opt.PollInterval))
		if err != nil {
			c.dropDealer(r)
			return replayFailed
		}
		if len(ps) == 0 {
			continue
		}
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			c.dropDealer(r)
			return replayFailed
		}
		if len(msg) > 0 && len(msg[0]) == 0 {
			msg = msg[1:]
		}
		var seqB, payload []byte
		switch len(msg) {
		case 3:
			seqB, payload = msg[1], msg[2]
		case 2:
			seqB, payload = msg[0], msg[1]
		default:
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
			continue
		}
		if len(seqB) != 8 {
			m.m.DecodeErrors.WithLabelValues(c.name()).Inc()
			continue
		}
		seq := binary.BigEndian.Uint64(seqB)
		if seq == math.MaxUint64 { // end marker
			switch {
			case first && !emptyOK:
				return replayPartial // nothing buffered from `from` on
			case hole:
				return replayPartial
			}
			return replayOK
		}
		isFirst := first
		if first {
			first = false
			// Above `from`: the requested seq was already evicted from the buffer. Below
			// it: the publisher resent batches we have (overlap), which got skips.
			hole = seq > from
		}
		if !got(seq, payload, isFirst) {
			hole = true
		}
	}
}

func (c *consumer) dealer(r int, ep string) (*zmq.Socket, error) {
	if d := c.dealers[r]; d != nil {
		return d, nil
	}
	d, err := c.s.newSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	if err := d.Connect(ep); err != nil {
		d.Close()
		return nil, err
	}
	c.dealers[r] = d
	return d, nil
}

func (c *consumer) dropDealer(r int) {
	if d := c.dealers[r]; d != nil {
		d.Close()
		delete(c.dealers, r)
	}
}
