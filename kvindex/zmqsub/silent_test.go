package zmqsub

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/kvevents"
	"github.com/kvroute/kvroute/workers"
)

// lockedBuf is a log sink safe for the manager's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// A worker that takes traffic for index.silent_after without one KV event gets one
// WARN naming its endpoint, the mode and the docs section (issue 29: connect mode
// against a publisher that also dials logged nothing); one whose events arrive, or
// that expects none, gets none. The check runs on the manager's sweep tick; here it
// is called directly, on a manual clock, with the sockets never started.
func TestSilentWorkerWarnedOnce(t *testing.T) {
	for _, bind := range []bool{false, true} {
		log := &lockedBuf{}
		c := &manualClock{t: time.Unix(1_800_000_000, 0)}
		ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute, Models: []kvindex.Model{{Name: "m", BlockSize: bs}}, Now: c.Now})
		o := Options{Index: ix, Logger: slog.New(slog.NewTextHandler(log, nil)), SilentAfter: time.Minute}
		if bind {
			o.BindEndpoint = "tcp://*:5557"
		}
		m, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		quiet := &workers.Worker{Name: "quiet", Address: "10.0.0.1:8000", Models: []string{"m"},
			KVEvents: workers.KVEvents{Endpoint: "tcp://10.0.0.1:5557"}}
		talky := &workers.Worker{Name: "talky", Address: "10.0.0.2:8000", Models: []string{"m"},
			KVEvents: workers.KVEvents{Endpoint: "tcp://10.0.0.2:5557"}}
		m.WorkerAdded(quiet)
		m.WorkerAdded(talky)
		keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), []uint32{1, 2, 3, 4}, bs, nil)
		ix.Book("quiet", keys)
		ix.Book("talky", keys)
		c.add(59 * time.Second)
		m.checkSilent()
		if strings.Contains(log.String(), "without one KV event") {
			t.Fatalf("bind %v: warned before silent_after:\n%s", bind, log)
		}
		if err := ix.ApplyBatch("talky", 0, &kvevents.Batch{}); err != nil {
			t.Fatal(err)
		}
		c.add(2 * time.Second)
		m.checkSilent()
		m.checkSilent()
		out := log.String()
		if n := strings.Count(out, "without one KV event"); n != 1 {
			t.Fatalf("bind %v: %d warnings, want 1 (quiet, once):\n%s", bind, n, out)
		}
		want := []string{"worker=quiet", "silent_for=1m1s", "index_mode=approximate", "docs=" + kvindex.DocsNoEvents}
		if bind {
			want = append(want, "mode=bind", "endpoint=tcp://*:5557", "expected_topic=kv@10.0.0.1:8000@{model}")
		} else {
			want = append(want, "mode=connect", "endpoint=tcp://10.0.0.1:5557", "also dials")
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Fatalf("bind %v: warning lacks %q:\n%s", bind, w, out)
			}
		}
		if strings.Contains(out, "worker=talky") {
			t.Fatalf("bind %v: a worker whose events arrive was warned about:\n%s", bind, out)
		}
	}
}

// A negative SilentAfter disables the warning (config: index.silent_after 0).
func TestSilentWarningDisabled(t *testing.T) {
	log := &lockedBuf{}
	c := &manualClock{t: time.Unix(1_800_000_000, 0)}
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: time.Minute, Now: c.Now})
	m, err := New(Options{Index: ix, Logger: slog.New(slog.NewTextHandler(log, nil)), SilentAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	m.WorkerAdded(&workers.Worker{Name: "w", Address: "10.0.0.1:8000", KVEvents: workers.KVEvents{Endpoint: "tcp://10.0.0.1:5557"}})
	ix.Book("w", []kvindex.Key{1})
	c.add(time.Hour)
	m.checkSilent()
	if log.String() != "" {
		t.Fatalf("warned with SilentAfter 0:\n%s", log)
	}
}
