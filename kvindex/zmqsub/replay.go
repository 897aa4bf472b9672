package zmqsub

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// replayKind says why a replay runs.
type replayKind uint8

// replayMsg is one message from a replay exchange: a replayed batch, or its end.
type replayMsg struct {
	id      uint64
	rank    int
	seq     uint64
	payload []byte
	first   bool // the exchange's first replayed batch
	end     bool
	res     replayResult // with end
}

type replayReq struct {
	ctx     context.Context // cancelled when the consumer abandons or ends the replay
	id      uint64
	from    uint64
	emptyOK bool
}

// replayResult classes one replay exchange.
type replayResult string

// replayer is one rank's replay goroutine's mailbox: the latest request wins (an
// earlier one not yet started was abandoned, its context cancelled).
type replayer struct {
	mu   sync.Mutex
	req  *replayReq // guarded by mu
	wake chan struct{}
}

func (rp *replayer) submit(q *replayReq) {
	rp.mu.Lock()
	rp.req = q
	rp.mu.Unlock()
	select {
	case rp.wake <- struct{}{}:
	default:
	}
}

// replay does the socket side of one exchange (see exchange); got gets each batch and
// returns false when ctx ended. ok is false when ctx ended (nothing to report); keep
// is true when the exchange ended at the end marker.
func (s *workerSub) replay(ctx context.Context, sock *zmq.Socket, from uint64, emptyOK bool, got func(seq uint64, payload []byte, first bool) bool) (res replayResult, ok, keep bool) {
	m := s.m
	if sock == nil {
		return replayFailed, true, false
	}
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], from)
	if _, err := sock.SendMessage("", seq8[:]); err != nil {
		return replayFailed, true, false
	}
	deadline := time.Now().Add(m.opt.ReplayTimeout)
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	first, hole := true, false
	expired := func() bool {
		select {
		case <-m.expireReplays: // nil outside tests: never
			return true
		default:
			return time.Until(deadline) <= 0
		}
	}
	for {
		if ctx.Err() != nil {
			return "", false, false
		}
		if expired() {
			if first {
				return replayFailed, true, false
			}
			return replayPartial, true, false
		}
		ps, err := poller.Poll(min(max(time.Until(deadline), time.Millisecond), m.opt.PollInterval))
		if err != nil {
			if errors.Is(err, zmq.Errno(4)) { // EINTR
				continue
			}
			return replayFailed, true, false
		}
		if len(ps) == 0 {
			continue
		}
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			return replayFailed, true, false
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
			m.m.DecodeErrors.WithLabelValues(s.w.Name).Inc()
			continue
		}
		if len(seqB) != 8 {
			m.m.DecodeErrors.WithLabelValues(s.w.Name).Inc()
			continue
		}
		seq := binary.BigEndian.Uint64(seqB)
		if seq == math.MaxUint64 { // end marker
			switch {
			case first && !emptyOK:
				return replayPartial, true, true // nothing buffered from `from` on
			case hole:
				return replayPartial, true, true
			}
			return replayOK, true, true
		}
		isFirst := first
		if first {
			first = false
			// Above `from`: the requested seq was already evicted from the buffer. Below
			// it: the publisher resent batches we have (overlap), which the consumer skips.
			hole = seq > from
		}
		if !got(seq, payload, isFirst) {
			return "", false, false
		}
	}
}

// runReplayer runs rank r's replay exchanges one at a time until ctx ends. It owns the
// rank's DEALER socket: kept between exchanges that ended at the end marker, closed
// after any other end (late replies must not reach the next exchange).
func (s *workerSub) runReplayer(ctx context.Context, r int, rp *replayer, out chan<- replayMsg) {
	var sock *zmq.Socket
	defer func() {
		if sock != nil {
			sock.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rp.wake:
		}
		rp.mu.Lock()
		q := rp.req
		rp.req = nil
		rp.mu.Unlock()
		if q == nil || q.ctx.Err() != nil {
			continue
		}
		if sock == nil {
			d, err := s.newSocket(zmq.DEALER)
			if err == nil {
				if err = d.Connect(EndpointForRank(s.w.KVEvents.ReplayEndpoint, r)); err != nil {
					d.Close()
				}
			}
			if err == nil {
				sock = d
			}
		}
		keep := s.exchange(q, r, sock, out)
		if !keep && sock != nil {
			sock.Close()
			sock = nil
		}
	}
}
