// Package kvtest is a test double of a vLLM worker's KV event publisher
// (vllm/distributed/kv_events.py ZmqEventPublisher) over real ZMQ sockets: a PUB
// socket sending [topic, seq (8 bytes big-endian), payload] with seq from 0, and a
// ROUTER replay socket answering ["", seq8] with ["", topic, seq8, payload] per buffered
// batch from seq on (["", seq8, payload] in the pre-0.26 layout), then the end marker
// ["", "", ff…ff, ""]. It can drop messages on the PUB side (to make gaps), bound its
// replay buffer (to make replays partial) and restart (seq back to 0).
package kvtest

import (
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/kvindex/kvevents"
)

// Options configures a Publisher.
type Options struct {
	// Endpoint the PUB socket binds ("tcp://127.0.0.1:*" by default) or, when Connect is
	// true, connects to (bind mode on kvroute's side).
	Endpoint string
	Connect  bool
	// ReplayEndpoint the ROUTER binds; "" means "tcp://127.0.0.1:*"; "-" disables replay.
	ReplayEndpoint string
	Topic          string
	// Buffer is the number of batches kept for replay (vLLM's buffer_steps). 0 means 10000.
	Buffer int
	// OldReplay answers replays without the topic frame (vLLM < 0.26).
	OldReplay bool
	// Encode selects the wire version of Publish; zero: vLLM ≥ 0.26.
	Encode kvevents.EncodeOptions
	// FirstSeq is the seq of the first message (vLLM starts at 0; some publishers at 1).
	FirstSeq uint64
	// ReplayOverlap resends that many buffered batches before the requested seq (a
	// replay that overlaps what the subscriber applied).
	ReplayOverlap int
	// ReplayMute reads replay requests and never answers them (a hung replay socket).
	ReplayMute bool
	// ReplayGate, when set, makes each replay answer late on the test's command: the
	// buffer is read when the request arrives (what the publisher held then), and the
	// answer is sent only after a value is received from ReplayGate (or Close). Requests
	// are served one at a time, so each answer takes one value.
	ReplayGate chan struct{}
	// ReplayRequests, when set, gets the requested seq of each replay request as it is
	// read (before the gate); sends never block (a full channel drops the notice).
	ReplayRequests chan uint64
}

type buffered struct {
	seq     uint64
	payload []byte
}

// Publisher is one simulated worker rank. Publish* are safe for concurrent use.
type Publisher struct {
	opt Options

	mu     sync.Mutex // guards pub, seq, buf
	pub    *zmq.Socket
	seq    uint64
	buf    []buffered
	pubEP  string
	repEP  string
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

// New starts a publisher. Close it.
func New(opt Options) (*Publisher, error) {
	if opt.Endpoint == "" {
		opt.Endpoint = "tcp://127.0.0.1:*"
	}
	if opt.ReplayEndpoint == "" {
		opt.ReplayEndpoint = "tcp://127.0.0.1:*"
	}
	if opt.Buffer <= 0 {
		opt.Buffer = 10000
	}
	p := &Publisher{opt: opt, seq: opt.FirstSeq, stop: make(chan struct{}), done: make(chan struct{})}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return nil, err
	}
	_ = pub.SetLinger(0)
	if opt.Connect {
		err = pub.Connect(opt.Endpoint)
		p.pubEP = opt.Endpoint
	} else {
		err = pub.Bind(opt.Endpoint)
		p.pubEP, _ = pub.GetLastEndpoint()
	}
	if err != nil {
		pub.Close()
		return nil, err
	}
	p.pub = pub
	if opt.ReplayEndpoint == "-" {
		close(p.done)
		return p, nil
	}
	router, err := zmq.NewSocket(zmq.ROUTER)
	if err == nil {
		_ = router.SetLinger(0)
		err = router.Bind(opt.ReplayEndpoint)
	}
	if err != nil {
		pub.Close()
		if router != nil {
			router.Close()
		}
		return nil, err
	}
	p.repEP, _ = router.GetLastEndpoint()
	go p.serveReplay(router)
	return p, nil
}

// Endpoint is the PUB endpoint (resolved port).
func (p *Publisher) Endpoint() string { return p.pubEP }

// ReplayEndpoint is the ROUTER endpoint (resolved port), "" when disabled.
func (p *Publisher) ReplayEndpoint() string { return p.repEP }

// Publish encodes b and sends it with the next seq, returning that seq.
func (p *Publisher) Publish(b *kvevents.Batch) (uint64, error) {
	pl, err := kvevents.EncodeWith(b, p.opt.Encode)
	if err != nil {
		return 0, err
	}
	return p.PublishRaw(pl, true)
}

// PublishRaw buffers payload under the next seq and, when send, sends it (send=false
// simulates a message the PUB socket dropped: a gap the subscriber must replay).
func (p *Publisher) PublishRaw(payload []byte, send bool) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("kvtest: publisher closed")
	}
	seq := p.seq
	p.seq++
	p.buf = append(p.buf, buffered{seq, payload})
	if len(p.buf) > p.opt.Buffer {
		p.buf = p.buf[len(p.buf)-p.opt.Buffer:]
	}
	if !send {
		return seq, nil
	}
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], seq)
	_, err := p.pub.SendMessage(p.opt.Topic, s8[:], payload)
	return seq, err
}

// SendRaw sends one message of arbitrary frames on the PUB socket, bypassing seq
// numbering and the replay buffer (hostile or broken publishers).
func (p *Publisher) SendRaw(parts ...[]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("kvtest: publisher closed")
	}
	args := make([]any, len(parts))
	for i, b := range parts {
		args[i] = b
	}
	_, err := p.pub.SendMessage(args...)
	return err
}

// Restart simulates a worker restart: seq back to 0, replay buffer emptied.
func (p *Publisher) Restart() {
	p.mu.Lock()
	p.seq = 0
	p.buf = nil
	p.mu.Unlock()
}

// Seq is the next seq to be published.
func (p *Publisher) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *Publisher) serveReplay(router *zmq.Socket) {
	defer close(p.done)
	defer router.Close()
	poller := zmq.NewPoller()
	poller.Add(router, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		ps, err := poller.Poll(50 * time.Millisecond)
		if err != nil || len(ps) == 0 {
			continue
		}
		msg, err := router.RecvMessageBytes(0)
		if err != nil || len(msg) != 3 || len(msg[2]) != 8 { // [identity, "", seq8]
			continue
		}
		if p.opt.ReplayMute {
			continue
		}
		id, from := msg[0], binary.BigEndian.Uint64(msg[2])
		if p.opt.ReplayRequests != nil {
			select {
			case p.opt.ReplayRequests <- from:
			default:
			}
		}
		p.mu.Lock()
		var out []buffered
		for i, b := range p.buf {
			if b.seq >= from || (i+p.opt.ReplayOverlap < len(p.buf) && p.buf[i+p.opt.ReplayOverlap].seq >= from) {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		if p.opt.ReplayGate != nil {
			select {
			case <-p.opt.ReplayGate:
			case <-p.stop:
				return
			}
		}
		for _, b := range out {
			var s8 [8]byte
			binary.BigEndian.PutUint64(s8[:], b.seq)
			if p.opt.OldReplay {
				_, _ = router.SendMessage(id, "", s8[:], b.payload)
			} else {
				_, _ = router.SendMessage(id, "", p.opt.Topic, s8[:], b.payload)
			}
		}
		var end [8]byte
		binary.BigEndian.PutUint64(end[:], math.MaxUint64)
		if p.opt.OldReplay {
			_, _ = router.SendMessage(id, "", end[:], "")
		} else {
			_, _ = router.SendMessage(id, "", "", end[:], "")
		}
	}
}

// Close closes both sockets and waits for the replay goroutine.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.pub.Close()
	p.mu.Unlock()
	close(p.stop)
	<-p.done
}
