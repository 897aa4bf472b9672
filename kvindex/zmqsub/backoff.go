package zmqsub

import "time"

// backoff is the wait between re-creations of one socket: it doubles per consecutive
// socket that ended unhealthy, from min up to max, and starts again at min after a
// healthy one (see Options.ReconnectMin), so a worker that flapped once reconnects at
// the shortest wait again once its connection has worked. Not safe for concurrent
// use: each socket owner has its own.
type backoff struct {
	min, max time.Duration
	next     time.Duration // the wait after the next unhealthy socket; 0 = min
}

// after returns the wait before re-creating a socket that just ended; healthy says
// whether it delivered a well-formed frame or stayed connected for at least max.
// Unhealthy in a row: min, 2·min, 4·min, … capped at max.
func (b *backoff) after(healthy bool) time.Duration {
	if healthy || b.next <= 0 {
		b.next = b.min
	}
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

// socketHealth tracks whether one socket was healthy: it received a well-formed frame,
// or its publisher connection stayed up for at least stayUp.
type socketHealth struct {
	stayUp      time.Duration
	framed      bool
	connectedAt time.Time // zero: not connected now
	stayedUp    bool      // a connection of this socket lasted stayUp
}

func (h *socketHealth) frame() { h.framed = true }

func (h *socketHealth) connected() { h.connectedAt = time.Now() }

func (h *socketHealth) disconnected() {
	if !h.connectedAt.IsZero() && time.Since(h.connectedAt) >= h.stayUp {
		h.stayedUp = true
	}
	h.connectedAt = time.Time{}
}

// healthy is read when the socket has ended.
func (h *socketHealth) healthy() bool {
	h.disconnected()
	return h.framed || h.stayedUp
}
