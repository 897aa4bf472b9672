package zmqsub

import (
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex/kvtest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The wait doubles per unhealthy socket, from min to max, and a healthy socket starts
// it again at min.
func TestBackoffAfter(t *testing.T) {
	b := backoff{min: 10 * time.Millisecond, max: 50 * time.Millisecond}
	ms := time.Millisecond
	for i, c := range []struct {
		healthy bool
		want    time.Duration
	}{{false, 10 * ms}, {false, 20 * ms}, {false, 40 * ms}, {false, 50 * ms}, {false, 50 * ms},
		{true, 10 * ms}, {false, 20 * ms}, {true, 10 * ms}, {true, 10 * ms}, {false, 20 * ms}} {
		if got := b.after(c.healthy); got != c.want {
			t.Fatalf("step %d after(%v) = %v, want %v", i, c.healthy, got, c.want)
		}
	}
}

type waitRec struct {
	healthy bool
	wait    time.Duration
}

// waitLog collects the reconnect waits of worker "a".
type waitLog struct {
	mu sync.Mutex
	ws []waitRec
}

func (l *waitLog) add(worker string, _ int, healthy bool, d time.Duration) {
	if worker != "a" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ws = append(l.ws, waitRec{healthy, d})
}

func (l *waitLog) get() []waitRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]waitRec(nil), l.ws...)
}

// Real ZMQ: a publisher whose every connection is closed (oversize message) before a
// well-formed frame arrives makes the subscription back off (20, 40, 80, 160, 320 ms);
// once a connection has delivered a frame, the next re-creation waits the minimum
// again. Before the fix a closed connection always waited the minimum (no backoff at
// all against a flapping publisher) and a socket error's doubled wait was never reset
// after the connection worked again.
func TestReconnectBackoffResetsAfterHealthyConnection(t *testing.T) {
	var log waitLog
	h := newHarness(t, func(o *Options) {
		o.MaxMessageBytes = 64 << 10
		o.reconnectWait = log.add
		// "stayed up" (a healthy socket without a frame) means connected ≥ ReconnectMax:
		// 10s keeps a connection that a loaded machine is slow to close unhealthy
		o.ReconnectMax = 10 * time.Second
	})
	p := newPublisher(t, kvtest.Options{})
	w := workerFor("a", p)
	w.KVEvents.ReplayEndpoint = ""
	h.addWorkers(w)
	big := make([]byte, 1<<20)
	minW, maxW := 20*time.Millisecond, 10*time.Second
	// Phase 1: only oversize messages, so no socket is healthy.
	h.eventually(func() bool {
		_ = p.SendRaw([]byte(""), make([]byte, 8), big)
		time.Sleep(5 * time.Millisecond)
		return len(log.get()) >= 5
	}, "fewer than 5 re-creations %s", lazy(func() string { return h.diag("a") }))
	unhealthy := log.get()
	want := minW
	for i, r := range unhealthy {
		if r.healthy || r.wait != want {
			t.Fatalf("re-creation %d: healthy=%v wait=%v, want unhealthy and %v (all: %v)", i, r.healthy, r.wait, want, unhealthy)
		}
		want = min(2*want, maxW)
	}
	// Phase 2: the connection delivers well-formed frames, then is closed.
	h.connected("a", p)
	disc := testutil.ToFloat64(h.ms.Disconnects.WithLabelValues("a"))
	h.eventually(func() bool {
		_ = p.SendRaw([]byte(""), make([]byte, 8), big)
		time.Sleep(5 * time.Millisecond)
		return testutil.ToFloat64(h.ms.Disconnects.WithLabelValues("a")) > disc && len(log.get()) > len(unhealthy)
	}, "the healthy connection was never closed %s", lazy(func() string { return h.diag("a") }))
	all := log.get()
	// Sockets re-created between the phases (an oversize message still in flight) may
	// have ended unhealthy; the first healthy one waits the minimum, and an unhealthy
	// one right after it 2 × the minimum.
	first := -1
	for i := len(unhealthy); i < len(all); i++ {
		if all[i].healthy {
			first = i
			break
		}
	}
	if first < 0 {
		t.Fatalf("no healthy socket after the well-formed frames: %v", all[len(unhealthy):])
	}
	if all[first].wait != minW {
		t.Fatalf("wait after the healthy connection = %v, want the minimum %v (all: %v)", all[first].wait, minW, all)
	}
	if first+1 < len(all) && !all[first+1].healthy && all[first+1].wait != 2*minW {
		t.Fatalf("wait after healthy then unhealthy = %v, want %v (all: %v)", all[first+1].wait, 2*minW, all)
	}
}

// A socket is healthy when it delivered a well-formed frame or when one of its
// publisher connections stayed up for stayUp (Options.ReconnectMax), also if it is still
// connected when the socket ends; a connection shorter than that, or none, is not. stayUp
// 0 makes any connection long enough and an hour none, so no case depends on timing.
func TestSocketHealthStayedUp(t *testing.T) {
	const never = time.Hour
	for _, c := range []struct {
		name   string
		stayUp time.Duration
		steps  string // c connected, d disconnected, f frame
		want   bool
	}{
		{"never connected", 0, "", false},
		{"frame only", never, "cf", true},
		{"connection stayed up, then closed", 0, "cd", true},
		{"still connected when the socket ends", 0, "c", true},
		{"connection shorter than stayUp", never, "cd", false},
		{"short reconnects, still short", never, "cdcdc", false},
		{"an earlier connection stayed up", 0, "cdc", true},
		{"disconnect without connect", 0, "d", false},
	} {
		h := socketHealth{stayUp: c.stayUp}
		for _, s := range c.steps {
			switch s {
			case 'c':
				h.connected()
			case 'd':
				h.disconnected()
			case 'f':
				h.frame()
			}
		}
		if got := h.healthy(); got != c.want {
			t.Errorf("%s (stayUp %v, %q): healthy = %v, want %v", c.name, c.stayUp, c.steps, got, c.want)
		}
	}
	// The backoff after a socket that stayed up starts again at the minimum.
	b := backoff{min: 10 * time.Millisecond, max: time.Second}
	b.after(false)
	b.after(false)
	h := socketHealth{stayUp: 0}
	h.connected()
	if got := b.after(h.healthy()); got != 10*time.Millisecond {
		t.Fatalf("wait after a connection that stayed up = %v, want the minimum", got)
	}
}
