package peers

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The inbound path is bounded across connections, not only per connection (gRPC's
// MaxConcurrentStreams is per connection, and any number of connections may open):
//
//   - connections: at most 4×MaxPeers held; one past that is closed on accept (a
//     replica dials each peer over one connection, a reconnecting one briefly two),
//     and one without a stream for idleConnTimeout is closed (a replica's sender
//     always holds its stream open; a refused stranger's connection goes idle);
//   - streams: at most 2×MaxPeers Exchange streams at once over all connections;
//     one past that ends at once (ResourceExhausted, dropped{reason="busy"});
//   - summaries in flight: a stream takes one of MaxInboundBytes/MaxMessageBytes
//     slots before it reads a message and holds it while the message is received,
//     decoded and applied, so the bytes held by summaries at once are at most
//     MaxInboundBytes (about three times that in memory: gRPC's buffer, its copy and the
//     decoded form). A stream waiting for a slot reads nothing (HTTP/2 flow control
//     holds its sender at the fixed window, flowWindow) and gives up when its
//     stream ends: no goroutine outlives its connection.
//
// Applying a summary books its keys in the index in batches of bookBatch
// (KeyImport.Update), so a worker's index lock, which the index's expiry sweep and the
// KV event path take too, is held for at most one batch at a time.
const (
	maxConnsPerPeer = 4
	idleConnTimeout = 10 * time.Second
	bookBatch       = 1024
	flowWindow      = 1 << 20 // HTTP/2 stream and connection window, bytes (fixed: no BDP growth)
)

// inbound holds the cross-connection bounds.
type inbound struct {
	slots   chan struct{} // summaries being received, decoded or applied
	streams atomic.Int64
	bytes   atomic.Int64 // bytes of the summaries holding a slot
}

func newInbound(slots int) *inbound { return &inbound{slots: make(chan struct{}, max(slots, 1))} }

// acquire waits for a slot until ctx ends.
func (in *inbound) acquire(ctx context.Context) bool {
	select {
	case in.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (in *inbound) release() { <-in.slots }

// limitListener closes connections accepted past max at once, instead of holding
// them: a flood of idle connections cannot keep a real peer from connecting later.
type limitListener struct {
	net.Listener
	max    int64
	open   atomic.Int64
	onDrop func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			l.onDrop()
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
