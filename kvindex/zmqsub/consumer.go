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
		p.started = true
		if f.seq > 0 { // joined late, or the first messages were lost (PUB slow joiner)
			c.recover(ctx, r, p, 0, f.seq)
		}
	case f.seq == p.next:
	case f.seq > p.next:
		m.m.Gaps.WithLabelValues(c.name()).Inc()
		c.recover(ctx, r, p, p.next, f.seq)
	case f.seq >= p.dupFloor:
		return // already applied from a replay
	default:
		m.m.Restarts.WithLabelValues(c.name()).Inc()
		m.log.Info("kvindex: KV event publisher restarted; dropping its entries", "worker", c.name(), "rank", r, "seq", f.seq, "expected", p.next)
		m.ix.ResetRank(c.name(), r)
		*p = pubState{started: true}
		if f.seq > 0 {
			c.recover(ctx, r, p, 0, f.seq)
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
	replayFailed  replayResult = "failed"  // no replay endpoint, timeout or socket error
)

// recover replays [from, upto) of rank r and applies what it gets. A partial or failed
// replay puts the worker in approximate mode (Index.Desync).
func (c *consumer) recover(ctx context.Context, r int, p *pubState, from, upto uint64) {
	m := c.s.m
	c.recovered = true
	p.next = from
	res := c.replay(ctx, r, from, upto == from, func(seq uint64, payload []byte, first bool) bool {
		if seq < p.next {
			return true
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
	if res == replayOK && p.next < upto {
		res = replayPartial // the buffer ended before the live message
	}
	if res != replayOK {
		m.ix.Desync(c.name()) // before the counter: whoever sees the count sees the mode
		m.log.Warn("kvindex: KV event replay incomplete; worker runs approximate until fresh events cover it",
			"worker", c.name(), "rank", r, "from", from, "upto", upto, "result", res)
	}
	m.m.Replays.WithLabelValues(c.name(), string(res)).Inc()
	p.dupFloor = from
	if p.next < upto {
		p.next = upto
	}
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
	if ep == "" {
		return replayFailed
	}
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
			hole = seq != from // the requested seq was already evicted from the buffer
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
