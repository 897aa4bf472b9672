package workers

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
)

// watcher is a registry listener that reports every change on a channel.
type watcher struct {
	mu      sync.Mutex
	changes chan struct{}
}

func newWatcher(r *Registry) *watcher {
	w := &watcher{changes: make(chan struct{}, 1000)}
	r.Subscribe(w)
	return w
}

func (w *watcher) WorkerAdded(*Worker)   { w.changes <- struct{}{} }
func (w *watcher) WorkerRemoved(*Worker) { w.changes <- struct{}{} }

// summary lists the registry as "name=address kv" lines, sorted by name.
func summary(r *Registry) []string {
	var out []string
	for _, w := range r.All() {
		out = append(out, w.Name+"="+w.Address+" "+w.KVEvents.Endpoint)
	}
	return out
}

// waitFor blocks until the registry's summary equals want, re-checking on every
// registry change; it fails after a generous deadline (never reached when correct).
func waitFor(t *testing.T, r *Registry, w *watcher, want []string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if got := summary(r); reflect.DeepEqual(got, want) {
			return
		}
		select {
		case <-w.changes:
		case <-deadline:
			t.Fatalf("registry never became %q; it is %q", want, summary(r))
		}
	}
}

func TestTemplateExpand(t *testing.T) {
	tm := Template{KVEventsEndpoint: "tcp://{ip}:{port}", KVEventsReplayEndpoint: "tcp://{ip}:5567", Models: []string{"m"}}
	w := tm.worker("n", "10.0.0.1", 8000, 5557)
	if w.Address != "10.0.0.1:8000" || w.KVEvents.Endpoint != "tcp://10.0.0.1:5557" || w.KVEvents.ReplayEndpoint != "tcp://10.0.0.1:5567" {
		t.Fatalf("got %+v", w)
	}
	w6 := tm.worker("n", "fd00::1", 8000, 5557)
	if w6.Address != "[fd00::1]:8000" || w6.KVEvents.Endpoint != "tcp://[fd00::1]:5557" {
		t.Fatalf("IPv6 must be bracketed: %+v", w6)
	}
	if w0 := tm.worker("n", "10.0.0.1", 8000, 0); w0.KVEvents.Endpoint != "" || w0.KVEvents.ReplayEndpoint != "" {
		t.Fatalf("without a kv port a {port} template must yield no endpoint (and then no replay): %+v", w0.KVEvents)
	}
	if w := (Template{}).worker("n", "10.0.0.1", 8000, 5557); w.KVEvents.Endpoint != "" {
		t.Fatalf("no template, no endpoint: %+v", w.KVEvents)
	}
}

// fakeResolver answers from a table that the test changes between refreshes.
type fakeResolver struct {
	mu    sync.Mutex
	addrs []string
	err   error
	calls int
}

func (f *fakeResolver) set(err error, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs, f.err = addrs, err
}

func (f *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if network != "ip" || host != "vllm.example" {
		return nil, errors.New("unexpected lookup " + network + " " + host)
	}
	if f.err != nil {
		return nil, f.err
	}
	var out []netip.Addr
	for _, a := range f.addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func TestDNSDiscoveryFollowsRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		res := &fakeResolver{}
		res.set(nil, "10.0.0.2", "10.0.0.1", "10.0.0.1")
		m := metrics.New(prometheus.NewRegistry()).Workers
		static := &Worker{Name: "static", Address: "10.9.9.9:8000"}
		d := &DNS{Registry: reg, Name: "vllm.example", HTTPPort: 8000, KVPort: 5557, Interval: 10 * time.Second,
			Template: Template{KVEventsEndpoint: "tcp://{ip}:{port}"}, Static: []*Worker{static}, Resolver: res, Metrics: m}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- d.Run(ctx) }()

		synctest.Wait()
		want := []string{"10.0.0.1:8000=10.0.0.1:8000 tcp://10.0.0.1:5557", "10.0.0.2:8000=10.0.0.2:8000 tcp://10.0.0.2:5557", "static=10.9.9.9:8000 "}
		if got := summary(reg); !reflect.DeepEqual(got, want) {
			t.Fatalf("first lookup (duplicates merged, static kept): got %q want %q", got, want)
		}

		res.set(nil, "10.0.0.2", "10.0.0.3")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		want = []string{"10.0.0.2:8000=10.0.0.2:8000 tcp://10.0.0.2:5557", "10.0.0.3:8000=10.0.0.3:8000 tcp://10.0.0.3:5557", "static=10.9.9.9:8000 "}
		if got := summary(reg); !reflect.DeepEqual(got, want) {
			t.Fatalf("after a refresh the removed address must go and the new one come: got %q want %q", got, want)
		}

		res.set(errors.New("SERVFAIL"))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := summary(reg); !reflect.DeepEqual(got, want) {
			t.Fatalf("a failed lookup must keep the previous workers: got %q", got)
		}
		if n := testutil.ToFloat64(m.Errors.WithLabelValues("dns", DiscoveryErrorLookup)); n != 1 {
			t.Fatalf("lookup errors = %v, want 1", n)
		}
		if n := testutil.ToFloat64(m.Refreshes.WithLabelValues("dns")); n != 2 {
			t.Fatalf("refreshes = %v, want 2", n)
		}
		if n := testutil.ToFloat64(m.Discovered.WithLabelValues("dns", "ready")); n != 2 {
			t.Fatalf("ready workers = %v, want 2", n)
		}

		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run must return nil on cancel, got %v", err)
		}
		if res.calls != 3 {
			t.Fatalf("lookups = %d, want 3 (one at start, one per interval)", res.calls)
		}
	})
}

func TestDNSEmptyAnswerRemovesWorkers(t *testing.T) {
	reg := NewRegistry()
	res := &fakeResolver{}
	res.set(nil, "10.0.0.1")
	d := &DNS{Registry: reg, Name: "vllm.example", HTTPPort: 8000, Interval: time.Second, Resolver: res}
	if !d.Refresh(t.Context()) || len(reg.All()) != 1 {
		t.Fatalf("first refresh: %q", summary(reg))
	}
	res.set(nil)
	if !d.Refresh(t.Context()) || len(reg.All()) != 0 {
		t.Fatalf("a successful empty answer means no workers: %q", summary(reg))
	}
}

// Two sources into one Union — a decode Service and a prefill Service, each with its
// role (their records carry no labels) — fill one registry beside the static workers;
// a refresh of one replaces its share only, and Sources runs both until cancelled.
func TestUnionOfSourcesWithRoles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		m := metrics.New(prometheus.NewRegistry()).Workers
		static := &Worker{Name: "static", Address: "10.9.9.9:8000"}
		u := &Union{Registry: reg, Static: []*Worker{static}}
		dres, pres := &fakeResolver{}, &fakeResolver{}
		dres.set(nil, "10.0.0.1", "10.0.0.2")
		pres.set(nil, "10.0.1.1")
		dec := &DNS{Registry: reg, Name: "vllm.example", HTTPPort: 8000, Interval: 10 * time.Second, Template: Template{Role: RoleDecode},
			Static: []*Worker{static}, Union: u, Source: "dns", Resolver: dres, Metrics: m}
		pre := &DNS{Registry: reg, Name: "vllm.example", HTTPPort: 8001, Interval: 10 * time.Second, Template: Template{Role: RolePrefill},
			Static: []*Worker{static}, Union: u, Source: "dns:prefill", Resolver: pres, Metrics: m}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- Sources{dec, pre}.Run(ctx) }()
		synctest.Wait()
		roles := func() map[string]Role {
			out := map[string]Role{}
			for _, w := range reg.All() {
				out[w.Name] = w.Role
			}
			return out
		}
		want := map[string]Role{"static": RoleAggregated, "10.0.0.1:8000": RoleDecode, "10.0.0.2:8000": RoleDecode, "10.0.1.1:8001": RolePrefill}
		if got := roles(); !reflect.DeepEqual(got, want) {
			t.Fatalf("registry %v, want %v", got, want)
		}
		dres.set(nil) // the decode Service empties: its workers go, the prefill ones stay
		time.Sleep(10 * time.Second)
		synctest.Wait()
		want = map[string]Role{"static": RoleAggregated, "10.0.1.1:8001": RolePrefill}
		if got := roles(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after the decode source emptied: %v, want %v", got, want)
		}
		if n := testutil.ToFloat64(m.Discovered.WithLabelValues("dns:prefill", "ready")); n != 1 {
			t.Fatalf("discovered{source=dns:prefill} = %v, want 1", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Sources.Run on cancel: %v", err)
		}
	})
}

// sourceFunc is a Source from a function (a source that fails to start, or one that
// runs until cancelled).
type sourceFunc func(context.Context) error

func (f sourceFunc) Run(ctx context.Context) error { return f(ctx) }

// Sources.Run: a source that cannot start fails the whole run and cancels the others.
func TestSourcesFailTogether(t *testing.T) {
	boom := errors.New("cannot list endpointslices")
	err := Sources{sourceFunc(func(ctx context.Context) error { <-ctx.Done(); return nil }),
		sourceFunc(func(context.Context) error { return boom })}.Run(t.Context())
	if !errors.Is(err, boom) {
		t.Fatalf("Sources.Run = %v, want the failing source's error", err)
	}
}
