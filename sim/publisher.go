package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// PublisherOptions configures a ZMQ KV event publisher (vllm/distributed/kv_events.py
// ZmqEventPublisher).
type PublisherOptions struct {
	// Endpoint of the PUB socket. Like vLLM it binds when the endpoint contains "*" or
	// "::" or is ipc:// or inproc://, and connects otherwise (the subscriber binds).
	Endpoint string
	// Mode overrides the rule: "bind" or "connect"; "" = vLLM's rule.
	Mode string
	// ReplayEndpoint of the ROUTER socket (always binds); "" = no replay.
	ReplayEndpoint string
	Topic          string  // topic frame; vLLM's default is ""
	BufferSteps    int     // batches kept for replay; 0 means 10,000 (vLLM buffer_steps)
	Encoder        Encoder // nil: MapEncoder
	// LegacyReplay omits the topic frame in replay replies (vLLM < 0.26).
	LegacyReplay bool
}

// Publisher sends event batches on PUB with seq numbers from 0 and answers replay
// requests on ROUTER. Safe for concurrent use.
type Publisher struct {
	opt  PublisherOptions
	mu   sync.Mutex // guards pub, seq, buf
	pub  *zmq.Socket
	seq  uint64
	buf  []buffered
	rep  *zmq.Socket
	stop chan struct{}
	done chan struct{}
	// PubAddr and ReplayAddr are the endpoints actually bound (ports resolved).
	PubAddr, ReplayAddr string
}

type buffered struct {
	seq     uint64
	payload []byte
}

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("sim: publisher closed")

// shouldBind mirrors vLLM's rule for the PUB endpoint.
func shouldBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// NewPublisher opens the sockets.
func NewPublisher(opt PublisherOptions) (*Publisher, error) {
	if opt.BufferSteps <= 0 {
		opt.BufferSteps = 10000
	}
	if opt.Encoder == nil {
		opt.Encoder = MapEncoder{}
	}
	p := &Publisher{opt: opt, stop: make(chan struct{}), done: make(chan struct{})}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return nil, err
	}
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(100000)
	bind := shouldBind(opt.Endpoint)
	switch opt.Mode {
	case "bind":
		bind = true
	case "connect":
		bind = false
	}
	if bind {
		err = pub.Bind(opt.Endpoint)
		p.PubAddr, _ = pub.GetLastEndpoint()
	} else {
		err = pub.Connect(opt.Endpoint)
		p.PubAddr = opt.Endpoint
	}
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("sim: kv events endpoint %s: %w", opt.Endpoint, err)
	}
	p.pub = pub
	if opt.ReplayEndpoint != "" {
		rep, err := zmq.NewSocket(zmq.ROUTER)
		if err == nil {
			_ = rep.SetLinger(0)
			err = rep.Bind(opt.ReplayEndpoint)
		}
		if err != nil {
			if rep != nil {
				rep.Close()
			}
			pub.Close()
			return nil, fmt.Errorf("sim: kv events replay endpoint %s: %w", opt.ReplayEndpoint, err)
		}
		p.ReplayAddr, _ = rep.GetLastEndpoint()
		p.rep = rep
		go p.serveReplay()
	} else {
		close(p.done)
	}
	return p, nil
}

// Publish encodes and sends one batch; batches without events are not sent (vLLM
// publishes only non-empty batches).
func (p *Publisher) Publish(b Batch) error {
	if len(b.Events) == 0 {
		return nil
	}
	payload := p.opt.Encoder.Encode(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub == nil {
		return ErrClosed
	}
	seq := p.seq
	p.seq++
	p.buf = append(p.buf, buffered{seq, payload})
	if len(p.buf) > p.opt.BufferSteps {
		p.buf = append(p.buf[:0], p.buf[len(p.buf)-p.opt.BufferSteps:]...)
	}
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], seq)
	_, err := p.pub.SendMessage(p.opt.Topic, s8[:], payload)
	return err
}

// serveReplay answers DEALER requests ["", seq8] with every buffered batch from seq on,
// then the end marker ["", "", ff×8, ""].
func (p *Publisher) serveReplay() {
	defer close(p.done)
	poller := zmq.NewPoller()
	poller.Add(p.rep, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		polled, err := poller.Poll(50 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := p.rep.RecvMessageBytes(0)
		if err != nil || len(msg) < 2 {
			continue
		}
		id := msg[0]
		start := msg[len(msg)-1]
		if len(start) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(start)
		p.mu.Lock()
		var todo []buffered
		for _, b := range p.buf {
			if b.seq >= from {
				todo = append(todo, b)
			}
		}
		p.mu.Unlock()
		for _, b := range todo {
			var s8 [8]byte
			binary.BigEndian.PutUint64(s8[:], b.seq)
			if p.opt.LegacyReplay {
				_, _ = p.rep.SendMessage(id, "", s8[:], b.payload)
			} else {
				_, _ = p.rep.SendMessage(id, "", p.opt.Topic, s8[:], b.payload)
			}
		}
		end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_, _ = p.rep.SendMessage(id, "", "", end, "")
	}
}

// Close closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.pub == nil {
		p.mu.Unlock()
		return nil
	}
	p.pub.Close()
	p.pub = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	if p.rep != nil {
		p.rep.Close()
	}
	return nil
}
