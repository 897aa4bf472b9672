package peers

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// sendLoop keeps a stream open to t and sends every new summary on it, reconnecting
// with backoff (100 ms doubling to 2 s) after a failure.
func (m *Manager) sendLoop(ctx context.Context, t *target) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sentAny, err := m.sendStream(ctx, t)
		t.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.FailedPrecondition {
			// This address is this replica itself (a discovery source lists every
			// replica, this one included): nothing to send there.
			t.self.Store(true)
			m.o.Logger.Debug("peer target is this replica", "addr", t.addr)
			return
		}
		msg := err.Error()
		t.lastErr.Store(&msg)
		m.o.Logger.Debug("peer stream ended", "addr", t.addr, "err", err)
		if sentAny {
			backoff = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (m *Manager) sendStream(ctx context.Context, t *target) (sentAny bool, err error) {
	t.resolve(ctx)
	cc, err := grpc.NewClient(t.addr, append(m.dialOptions(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: m.o.SilenceTimeout, PermitWithoutStream: true}))...)
	if err != nil {
		return false, err
	}
	defer cc.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := openStream(sctx, cc)
	if err != nil {
		return false, err
	}
	// The peer answers only by ending the stream (an error, or this replica itself):
	// receive concurrently so that the end is seen without waiting for the next send.
	ended := make(chan error, 1)
	go func() { ended <- st.RecvMsg(&frame{}) }()
	var last uint64
	for {
		cur := m.cur.Load()
		if cur.seq != last && cur.seq != 0 {
			if err := st.SendMsg(&frame{b: cur.b}); err != nil {
				if errors.Is(err, io.EOF) { // the real status comes from RecvMsg
					err = <-ended
				}
				return sentAny, err
			}
			last, sentAny = cur.seq, true
			t.connected.Store(true)
			t.msgs.Add(1)
			m.sent.Add(uint64(len(cur.b)))
			m.o.Metrics.BytesSent.Add(float64(len(cur.b)))
		}
		select {
		case <-ctx.Done():
			_ = st.CloseSend()
			return sentAny, ctx.Err()
		case err := <-ended:
			if err == nil {
				err = errors.New("peer ended the stream")
			}
			return sentAny, err
		case <-cur.changed:
		}
	}
}

// exchange serves one peer's inbound stream.
func (m *Manager) exchange(stream grpc.ServerStream) error {
	m.mu.Lock()
	m.gen++
	gen := m.gen
	m.mu.Unlock()
	remote := ""
	if p, ok := peerAddr(stream.Context()); ok {
		remote = p
	}
	var id string
	f := &frame{}
	for {
		err := stream.RecvMsg(f)
		if err != nil {
			if id != "" {
				m.streamEnded(id, gen)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		m.recv.Add(uint64(len(f.b)))
		m.o.Metrics.BytesReceived.Add(float64(len(f.b)))
		s, err := decode(f.b, m.lim)
		if err != nil {
			m.o.Metrics.Dropped.WithLabelValues(DropMalformed).Inc()
			if id != "" {
				m.streamEnded(id, gen)
			}
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if id != "" && s.Replica != id {
			m.o.Metrics.Dropped.WithLabelValues(DropMalformed).Inc()
			m.streamEnded(id, gen)
			return status.Error(codes.InvalidArgument, "peers: replica id changed within a stream")
		}
		id = s.Replica
		if err := m.apply(s, gen, remote, len(f.b)); err != nil {
			return err
		}
	}
}

func (m *Manager) streamEnded(id string, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.peers[id]; p != nil && p.stream == gen {
		m.dropLocked(p, ExpireStream)
		delete(m.peers, id)
		m.publishLocked()
	}
}

type target struct {
	addr      string
	cancel    context.CancelFunc
	connected atomic.Bool
	self      atomic.Bool
	msgs      atomic.Uint64
	lastErr   atomic.Pointer[string]
	ips       atomic.Pointer[[]netip.Addr] // the host's addresses at the last dial (knownLocked)
}
