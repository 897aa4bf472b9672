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
	if n := m.in.streams.Add(1); n > int64(2*m.o.MaxPeers) {
		m.in.streams.Add(-1)
		m.o.Metrics.Dropped.WithLabelValues(DropBusy).Inc()
		return status.Errorf(codes.ResourceExhausted, "peers: already %d inbound streams (2 × peers.max_peers)", n-1)
	}
	defer m.in.streams.Add(-1)
	var id string
	for {
		s, n, err := m.receive(stream)
		if err == nil && id != "" && s.Replica != id {
			m.o.Metrics.Dropped.WithLabelValues(DropMalformed).Inc()
			err = status.Error(codes.InvalidArgument, "peers: replica id changed within a stream")
		}
		if err == nil {
			id = s.Replica
			err = m.apply(s, gen, remote, n)
			m.in.bytes.Add(-int64(n))
			m.o.Metrics.InboundBytes.Set(float64(m.in.bytes.Load()))
			m.in.release()
			if err == nil {
				continue
			}
			return err // apply refused this peer; it held no state from this stream
		}
		if id != "" {
			m.streamEnded(id, gen)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}

// receive takes an inbound slot, reads and decodes one summary. On success the slot is
// still held (the caller applies the summary, then releases it) and n is its size; on
// an error it is released.
func (m *Manager) receive(stream grpc.ServerStream) (s *Summary, n int, err error) {
	if !m.in.acquire(stream.Context()) {
		return nil, 0, stream.Context().Err()
	}
	f := &frame{}
	if err := stream.RecvMsg(f); err != nil {
		m.in.release()
		return nil, 0, err
	}
	n = len(f.b)
	m.in.bytes.Add(int64(n))
	m.o.Metrics.InboundBytes.Set(float64(m.in.bytes.Load()))
	m.recv.Add(uint64(n))
	m.o.Metrics.BytesReceived.Add(float64(n))
	s, err = decode(f.b, m.lim)
	if err != nil {
		m.in.bytes.Add(-int64(n))
		m.o.Metrics.InboundBytes.Set(float64(m.in.bytes.Load()))
		m.in.release()
		m.o.Metrics.Dropped.WithLabelValues(DropMalformed).Inc()
		return nil, 0, status.Error(codes.InvalidArgument, err.Error())
	}
	return s, n, nil
}

func (m *Manager) streamEnded(id string, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.peers[id]; p != nil && p.stream == gen {
		m.dropLocked(p, ExpireStream)
		delete(m.peers, id)
		m.markDirty()
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
