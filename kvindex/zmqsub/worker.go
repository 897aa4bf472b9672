package zmqsub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/workers"
)

// frame is one received PUB message [topic, seq (8 bytes big-endian), payload], or a
// marker that rank's SUB connected again after losing its publisher.
type frame struct {
	rank        int // data-parallel rank; -1 = read it from the payload (bind mode)
	topic       string
	seq         uint64
	payload     []byte
	reconnected bool // rank's SUB connected again after losing its publisher
	restarted   bool // the worker restarted (Manager.WorkerRestarted): every rank
}

// workerSub is one worker's subscription: receivers (one per rank in connect mode)
// feeding a bounded queue, and one consumer applying it in order.
type workerSub struct {
	m *Manager
	w *workers.Worker
	q chan frame
	// resync is a one-slot, coalescing signal: a message was dropped (full queue), so
	// the consumer replays every rank from its next expected seq.
	resync chan struct{}

	mu      sync.Mutex
	cancel  context.CancelFunc // guarded by mu; nil until started
	stopped bool               // guarded by mu
	done    chan struct{}      // closed when every goroutine of this sub has exited
}

func newWorkerSub(m *Manager, w *workers.Worker) *workerSub {
	return &workerSub{m: m, w: w, q: make(chan frame, m.opt.QueueSize), resync: make(chan struct{}, 1), done: make(chan struct{})}
}

func (s *workerSub) ranks() int { return max(s.w.KVEvents.DPSize, 1) }

func (s *workerSub) start(parent context.Context, mwg *sync.WaitGroup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	run(s.consume)
	if s.w.KVEvents.Endpoint != "" {
		for r := 0; r < s.ranks(); r++ {
			run(func(ctx context.Context) { s.receive(ctx, r) })
		}
	}
	mwg.Add(1)
	go func() {
		wg.Wait()
		close(s.done)
		mwg.Done()
	}()
}

func (s *workerSub) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.cancel != nil {
		s.cancel()
	}
}

// wait blocks until the sub's goroutines have exited (immediately if never started).
func (s *workerSub) wait() {
	s.mu.Lock()
	started := s.cancel != nil
	s.mu.Unlock()
	if started {
		<-s.done
	}
}

// enqueue never blocks: a full queue drops the message and signals a resync (the
// message may have been the last one, so the consumer cannot wait for a gap to show).
func (s *workerSub) enqueue(f frame) {
	select {
	case s.q <- f:
	default:
		s.m.m.QueueDrops.WithLabelValues(s.w.Name).Inc()
		select {
		case s.resync <- struct{}{}:
		default: // one pending resync covers every drop until it runs
		}
	}
}

// enqueueWait queues a marker frame, waiting for room (markers are rare and must not
// be lost) until ctx ends.
func (s *workerSub) enqueueWait(ctx context.Context, f frame) {
	select {
	case s.q <- f:
	case <-ctx.Done():
	}
}

// EndpointForRank returns the endpoint data-parallel rank r publishes on: tcp port +
// r, or for ipc/inproc the path with "_dp<r>" appended (vllm/distributed/kv_events.py
// offsets endpoints the same way). Rank 0 is the endpoint itself.
func EndpointForRank(ep string, r int) string {
	if r == 0 {
		return ep
	}
	if strings.HasPrefix(ep, "tcp://") {
		u, err := url.Parse(ep)
		if err == nil {
			if p, err := strconv.Atoi(u.Port()); err == nil {
				return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(p+r))
			}
		}
		return ep
	}
	return ep + "_dp" + strconv.Itoa(r)
}

// receive owns one SUB socket for rank r, re-creating it with backoff (see backoff)
// after errors and closed publisher connections.
func (s *workerSub) receive(ctx context.Context, r int) {
	ep := EndpointForRank(s.w.KVEvents.Endpoint, r)
	b := backoff{min: s.m.opt.ReconnectMin, max: s.m.opt.ReconnectMax}
	lost := false // the publisher connection was lost: the next connect is a reconnect
	for {
		health := socketHealth{stayUp: s.m.opt.ReconnectMax}
		err := s.receiveOnce(ctx, ep, r, &lost, &health)
		if ctx.Err() != nil {
			return
		}
		s.m.m.Reconnects.WithLabelValues(s.w.Name).Inc()
		healthy := health.healthy()
		wait := b.after(healthy)
		if f := s.m.opt.reconnectWait; f != nil {
			f(s.w.Name, r, healthy, wait)
		}
		if errors.Is(err, errDisconnected) {
			s.m.log.Info("kvindex: KV event publisher disconnected; re-creating the subscription", "worker", s.w.Name, "endpoint", ep, "healthy", healthy, "backoff", wait)
		} else {
			s.m.log.Warn("kvindex: KV event subscription failed; retrying", "worker", s.w.Name, "endpoint", ep, "err", err, "healthy", healthy, "backoff", wait)
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// errDisconnected ends a SUB socket whose publisher connection was closed. ZMQ
// reconnects a connection that failed (peer gone), but not one it closed itself for a
// protocol error — a message part over ZMQ_MAXMSGSIZE is one (libzmq 4.3
// session_base_t::engine_error terminates the session): that socket would never
// receive again. Re-creating the socket after every disconnect covers both cases.
var errDisconnected = errors.New("publisher connection closed")

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *workerSub) newSocket(t zmq.Type) (*zmq.Socket, error) { return s.m.newSocket(t) }

// newSocket creates a socket with kvroute's options: no linger, the reconnect backoff,
// and ZMQ_MAXMSGSIZE = Options.MaxMessageBytes, so that ZMQ drops (and disconnects) a
// peer sending a larger message part before allocating it. Every socket the manager
// opens is made here.
func (m *Manager) newSocket(t zmq.Type) (*zmq.Socket, error) {
	sock, err := zmq.NewSocket(t)
	if err != nil {
		return nil, err
	}
	_ = sock.SetLinger(0)
	_ = sock.SetReconnectIvl(m.opt.ReconnectMin)
	_ = sock.SetReconnectIvlMax(m.opt.ReconnectMax)
	if err := sock.SetMaxmsgsize(m.opt.MaxMessageBytes); err != nil {
		sock.Close()
		return nil, err
	}
	return sock, nil
}

var monitorSeq atomic.Uint64

// monitor returns a PAIR socket receiving sock's disconnect events (ZMQ closes a
// connection whose peer sent a message over ZMQ_MAXMSGSIZE, or that went away), owned
// by sock's goroutine, and stop, which ends the monitoring and closes it; stop must run
// before sock is closed. nil when ZMQ cannot monitor (the count is then lost, nothing
// else). Order matters: libzmq sends each event from its I/O thread with a blocking
// send on a PAIR socket, which blocks while no peer is connected — closing mon while
// sock is still monitored can freeze that thread, and with it every socket of the
// context, at the next event.
func (m *Manager) monitor(sock *zmq.Socket, events zmq.Event) (mon *zmq.Socket, stop func()) {
	addr := fmt.Sprintf("inproc://kvroute-zmqsub-monitor-%d", monitorSeq.Add(1))
	if err := sock.Monitor(addr, events); err != nil {
		return nil, func() {}
	}
	stop = func() {
		_ = sock.Monitor("", 0) // zmq_socket_monitor(sock, NULL, 0): no event is sent after it
		if mon != nil {
			mon.Close()
		}
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		mon = nil
		return nil, stop
	}
	_ = mon.SetLinger(0)
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		mon = nil
		return nil, stop
	}
	return mon, stop
}

// receiveOnce runs one SUB socket for rank r until ctx ends (nil), a socket error, or
// its publisher connection closes (errDisconnected). *lost carries "the connection was
// lost" across sockets: the next socket's first connect queues the reconnected marker.
// health records the socket's frames and connection.
func (s *workerSub) receiveOnce(ctx context.Context, ep string, r int, lost *bool, health *socketHealth) error {
	sock, err := s.newSocket(zmq.SUB)
	if err != nil {
		return err
	}
	defer sock.Close()
	if err := sock.SetSubscribe(s.w.KVEvents.Topic); err != nil {
		return err
	}
	mon, stopMon := s.m.monitor(sock, zmq.EVENT_DISCONNECTED|zmq.EVENT_CONNECTED)
	defer stopMon() // before sock.Close (deferred earlier)
	if err := sock.Connect(ep); err != nil {
		return err
	}
	disc := s.m.m.Disconnects.WithLabelValues(s.w.Name)
	return recvLoop(ctx, sock, mon, s.m.opt.PollInterval, func(f frame) {
		f.rank = r
		health.frame()
		s.enqueue(f)
	}, func() { s.m.m.DecodeErrors.WithLabelValues(s.w.Name).Inc() }, func(ev zmq.Event) error {
		switch ev {
		case zmq.EVENT_DISCONNECTED:
			health.disconnected()
			disc.Inc()
			*lost = true
			return errDisconnected
		case zmq.EVENT_CONNECTED:
			health.connected()
			if *lost {
				// Connected again after losing the publisher: almost always a new engine
				// process (restart), whose cache starts empty. Its entries go now, in
				// order with the frames, not when its first event shows the seq reset.
				*lost = false
				s.enqueueWait(ctx, frame{rank: r, reconnected: true})
			}
		}
		return nil
	})
}

// recvLoop receives PUB messages from sock until ctx ends (nil) or a socket error;
// got gets each well-formed frame, bad is called for any other message, event for
// each event from mon (may be nil); an error from event ends the loop with it (frames
// already queued in sock are received first).
func recvLoop(ctx context.Context, sock, mon *zmq.Socket, poll time.Duration, got func(frame), bad func(), event func(zmq.Event) error) error {
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	if mon != nil {
		poller.Add(mon, zmq.POLLIN)
	}
	for ctx.Err() == nil {
		ps, err := poller.Poll(poll)
		if err != nil {
			if errors.Is(err, zmq.Errno(4)) { // EINTR
				continue
			}
			return err
		}
		if len(ps) == 0 {
			continue
		}
		var stop error
		for mon != nil && stop == nil {
			ev, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
			if err != nil {
				break
			}
			stop = event(ev)
		}
		for ctx.Err() == nil {
			msg, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(11) { // EAGAIN: drained
					break
				}
				return err
			}
			if len(msg) != 3 || len(msg[1]) != 8 {
				bad()
				continue
			}
			got(frame{topic: string(msg[0]), seq: binary.BigEndian.Uint64(msg[1]), payload: msg[2]})
		}
		if stop != nil {
			return stop
		}
	}
	return nil
}

// runBind owns the bind-mode SUB socket.
func (m *Manager) runBind(ctx context.Context) error {
	b := backoff{min: m.opt.ReconnectMin, max: m.opt.ReconnectMax}
	first := true
	for {
		health := socketHealth{stayUp: m.opt.ReconnectMax}
		sock, err := m.newSocket(zmq.SUB)
		if err != nil {
			return err
		}
		mon, stopMon := m.monitor(sock, zmq.EVENT_DISCONNECTED)
		_ = sock.SetSubscribe("")
		if err := sock.Bind(m.opt.BindEndpoint); err != nil {
			if first {
				stopMon()
				sock.Close()
				return err
			}
		} else {
			if first {
				ep, _ := sock.GetLastEndpoint()
				m.bound <- ep
				first = false
			}
			err = recvLoop(ctx, sock, mon, m.opt.PollInterval, func(f frame) { f.rank = -1; health.frame(); m.dispatch(f) },
				func() { m.m.DroppedMessages.WithLabelValues("malformed_frame").Inc() },
				func(zmq.Event) error { m.m.Disconnects.WithLabelValues("").Inc(); return nil })
		}
		stopMon()
		sock.Close()
		if ctx.Err() != nil {
			return nil
		}
		// a bound socket has many publishers: healthy means it received a frame
		healthy := health.healthy()
		wait := b.after(healthy)
		if f := m.opt.reconnectWait; f != nil {
			f("", 0, healthy, wait)
		}
		m.log.Warn("kvindex: bound KV event socket failed; re-binding", "endpoint", m.opt.BindEndpoint, "err", err, "healthy", healthy, "backoff", wait)
		if !sleepCtx(ctx, wait) {
			return nil
		}
	}
}

// pubState tracks one publisher (worker, rank).
type pubState struct {
	started bool
	next    uint64 // next expected seq
	// dupFloor: live messages with dupFloor ≤ seq < next were already applied from a
	// replay (they were queued while it ran); lower seqs mean the publisher restarted.
	dupFloor uint64
	// pend: the replay in flight for this publisher (nil: none); while set, live frames
	// wait in its reorder buffer
	pend *pending
}

// consume applies the worker's queue in order and the replies of its replay exchanges
// (which own their replay sockets).
func (s *workerSub) consume(ctx context.Context) {
	c := newConsumer(ctx, s)
	defer c.close()
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-s.q:
			c.handle(f)
		case rm := <-c.replies:
			c.replayed(rm)
		case <-s.resync:
			c.resyncAll()
		}
	}
}
