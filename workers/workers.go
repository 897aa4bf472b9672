// Package workers holds the set of inference workers (endpoints) kvroute routes to:
// the registry, discovery sources (static config first), the scraped view of each
// worker's own vLLM /metrics, and health.
package workers

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Profile is what kvroute assumes about a worker's speed before it has learned anything.
// Zero fields mean "use the model's or the global default".
type Profile struct {
	PrefillTokensPerSecond float64       // uncached prompt tokens prefilled per second, one request alone
	DecodeTokensPerSecond  float64       // tokens generated per second per sequence at small batch
	Overhead               time.Duration // fixed time from arrival to first token besides prefill (scheduling, network)
	BlockCapacity          int           // KV cache capacity in blocks (for approximate mode); 0 unknown
	// MaxNumSeqs is the engine's --max-num-seqs (requests it runs in one step); 0 =
	// router.Saturation's (vLLM's default, router.DefaultMaxNumSeqs).
	MaxNumSeqs int
}

// KVEvents says where a worker publishes vLLM KV cache events.
type KVEvents struct {
	Endpoint       string // ZMQ PUB endpoint kvroute's SUB connects to, e.g. tcp://10.0.0.5:5557; "" = none
	ReplayEndpoint string // ZMQ ROUTER replay endpoint; "" = no replay
	Topic          string // topic filter; "" = all
	DPSize         int    // data-parallel ranks; rank r publishes on port+r (0 or 1 = one rank)
}

// Worker is one inference endpoint.
type Worker struct {
	Name     string   // unique name; defaults to Address
	Address  string   // HTTP endpoint "ip:port", written into the destination header
	Models   []string // served model names (and LoRA adapters) this worker accepts; empty = any
	KVEvents KVEvents
	Profile  Profile
	// Role is the worker's part in prefill/decode disaggregation (RolePrefill,
	// RoleDecode, RoleBoth); "" an aggregated worker, never in a pair.
	Role Role
}

// Role is a worker's part in prefill/decode disaggregation (P/D), after vLLM's
// --kv-transfer-config kv_role (vllm/config/kv_transfer.py): kv_producer prefills and
// hands its KV cache on, kv_consumer receives it and decodes, kv_both does either. The
// zero value is a worker without a KV connector: it serves each request alone.
type Role string

// The roles.
const (
	RoleAggregated Role = ""        // no KV connector: prefills and decodes its own requests only
	RolePrefill    Role = "prefill" // prefill only: the first leg of a disaggregated request
	RoleDecode     Role = "decode"  // decodes, from a prefill worker's KV or prefilling itself
	RoleBoth       Role = "both"    // either leg of a pair, or a request alone
)

// ParseRole returns the role named s ("" → RoleAggregated) or an error naming the
// choices.
func ParseRole(s string) (Role, error) {
	switch Role(s) {
	case RoleAggregated, RolePrefill, RoleDecode, RoleBoth:
		return Role(s), nil
	}
	return "", fmt.Errorf("role %q is not one of prefill, decode, both (or empty: aggregated)", s)
}

// Prefills reports whether a worker of role r may prefill for another worker (prefill
// or both).
func (r Role) Prefills() bool { return r == RolePrefill || r == RoleBoth }

// ReceivesKV reports whether a worker of role r may decode from another worker's
// prefill (decode or both).
func (r Role) ReceivesKV() bool { return r == RoleDecode || r == RoleBoth }

// Decodes reports whether a worker of role r may answer a request (every role but
// prefill).
func (r Role) Decodes() bool { return r != RolePrefill }

// Serves reports whether w serves model. A worker with no Models serves any model
// (a configuration that lists workers but no models).
func (w *Worker) Serves(model string) bool {
	if len(w.Models) == 0 {
		return true
	}
	for _, m := range w.Models {
		if m == model {
			return true
		}
	}
	return false
}

// Load is a worker's own view of itself, scraped from its vLLM /metrics.
type Load struct {
	Waiting   float64   `json:"waiting"`    // vllm:num_requests_waiting
	Running   float64   `json:"running"`    // vllm:num_requests_running
	KVUsage   float64   `json:"kv_usage"`   // vllm:kv_cache_usage_perc, 0..1
	ScrapedAt time.Time `json:"scraped_at"` // zero if never scraped
	// ProcessStart is the server process's process_start_time_seconds (Unix seconds;
	// prometheus_client's process collector, in vLLM's /metrics with one API server);
	// 0 when not exported. A change means the worker restarted.
	ProcessStart float64 `json:"process_start,omitempty"`
	// Adapters is the worker's LoRA state (vllm:lora_requests_info); zero when it
	// exports none.
	Adapters Adapters `json:"adapters,omitempty"`
}

// Registry is the current set of workers. Safe for concurrent use.
// Listeners are told about additions and removals so that the index, event
// subscriptions and in-flight state follow the set.
type Registry struct {
	mu        sync.RWMutex
	workers   map[string]*Worker // guarded by mu
	healthy   map[string]bool    // guarded by mu; absent = healthy
	load      map[string]Load    // guarded by mu
	listeners []Listener         // guarded by mu
	version   uint64             // guarded by mu; bumped on every change
	sorted    atomic.Pointer[sortedWorkers]
}

// sortedWorkers is every worker sorted by name at one registry version, built once per
// change instead of sorting on every Candidates call (the request path).
type sortedWorkers struct {
	version uint64
	ws      []*Worker
}

// Listener is told about registry changes. Calls are made outside the registry lock,
// in the order changes happened; a listener must not block for long.
type Listener interface {
	WorkerAdded(w *Worker)
	WorkerRemoved(w *Worker)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{workers: map[string]*Worker{}, healthy: map[string]bool{}, load: map[string]Load{}}
}

// Subscribe adds a listener and replays the current workers to it as additions.
func (r *Registry) Subscribe(l Listener) {
	r.mu.Lock()
	r.listeners = append(r.listeners, l)
	cur := r.sortedLocked()
	r.mu.Unlock()
	for _, w := range cur {
		l.WorkerAdded(w)
	}
}

// Set replaces the whole set (static config, or a discovery snapshot): workers not in
// ws are removed, new ones added, changed ones removed and re-added.
func (r *Registry) Set(ws []*Worker) {
	r.mu.Lock()
	next := make(map[string]*Worker, len(ws))
	for _, w := range ws {
		next[w.Name] = w
	}
	var added, removed []*Worker
	for name, old := range r.workers {
		if nw, ok := next[name]; !ok || !sameWorker(old, nw) {
			removed = append(removed, old)
			delete(r.workers, name)
			delete(r.load, name)
			delete(r.healthy, name)
		}
	}
	for name, w := range next {
		if _, ok := r.workers[name]; !ok {
			r.workers[name] = w
			added = append(added, w)
		}
	}
	if len(added)+len(removed) > 0 {
		r.version++
	}
	ls := append([]Listener(nil), r.listeners...)
	r.mu.Unlock()
	sort.Slice(removed, func(i, j int) bool { return removed[i].Name < removed[j].Name })
	sort.Slice(added, func(i, j int) bool { return added[i].Name < added[j].Name })
	for _, l := range ls {
		for _, w := range removed {
			l.WorkerRemoved(w)
		}
		for _, w := range added {
			l.WorkerAdded(w)
		}
	}
}

func sameWorker(a, b *Worker) bool {
	if a.Address != b.Address || a.Role != b.Role || a.KVEvents != b.KVEvents || a.Profile != b.Profile || len(a.Models) != len(b.Models) {
		return false
	}
	for i := range a.Models {
		if a.Models[i] != b.Models[i] {
			return false
		}
	}
	return true
}

// Get returns the worker named name.
func (r *Registry) Get(name string) (*Worker, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	w, ok := r.workers[name]
	return w, ok
}

// All returns every worker, sorted by name.
func (r *Registry) All() []*Worker {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.sortedLocked()
}

func (r *Registry) sortedLocked() []*Worker {
	out := make([]*Worker, 0, len(r.workers))
	for _, w := range r.workers {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Candidates appends to dst the healthy workers serving model, sorted by name, and
// reports whether any worker (healthy or not) serves it.
func (r *Registry) Candidates(model string, dst []*Worker) (_ []*Worker, known bool) {
	dst, known, _ = r.CandidatesAt(model, dst)
	return dst, known
}

// CandidatesAt is Candidates, also returning the registry version it read: while
// Version still returns it, the same workers are registered.
func (r *Registry) CandidatesAt(model string, dst []*Worker) (_ []*Worker, known bool, version uint64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s := r.sorted.Load()
	if s == nil || s.version != r.version {
		s = &sortedWorkers{version: r.version, ws: r.sortedLocked()}
		r.sorted.Store(s) // concurrent readers may each build one: equal snapshots
	}
	for _, w := range s.ws {
		if model != "" && !w.Serves(model) {
			continue
		}
		known = true
		if h, ok := r.healthy[w.Name]; ok && !h {
			continue
		}
		dst = append(dst, w)
	}
	return dst, known, r.version
}

// Version is bumped by every change of the registered workers (not of health or load).
func (r *Registry) Version() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.version
}

// SetHealthy marks a worker healthy or not (health checks, scrape failures).
func (r *Registry) SetHealthy(name string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, exists := r.workers[name]; exists {
		r.healthy[name] = ok
	}
}

// Healthy reports a worker's health (true when never marked).
func (r *Registry) Healthy(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.healthy[name]
	return !ok || h
}

// SetLoad records a scraped load for a worker.
func (r *Registry) SetLoad(name string, l Load) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, exists := r.workers[name]; exists {
		r.load[name] = l
	}
}

// Load returns the last scraped load of a worker (zero Load if never scraped).
func (r *Registry) Load(name string) Load {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.load[name]
}

// Loads appends the load of each of ws to dst (one lock for all: the request path).
func (r *Registry) Loads(ws []*Worker, dst []Load) []Load {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, w := range ws {
		dst = append(dst, r.load[w.Name])
	}
	return dst
}
