package workers

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/metrics"
)

// Source is a discovery source. Run fills the registry with the source's current
// workers (plus the static ones) by calling Registry.Set on every change, and keeps
// doing so until ctx is cancelled; it returns nil then. It returns an error only when
// it cannot start (e.g. the API server refuses the first list). A failed refresh keeps
// the previous set: a DNS outage must not empty the router.
type Source interface {
	Run(ctx context.Context) error
}

// Discovery error classes, the values of the "reason" label of
// kvroute_discovery_errors_total.
const (
	DiscoveryErrorLookup     = "lookup"      // DNS lookup or API list failed
	DiscoveryErrorNoPort     = "no_port"     // an EndpointSlice lacks the named HTTP port
	DiscoveryErrorBadAddress = "bad_address" // an address is not a literal IP (e.g. FQDN slices)
)

// Template describes every discovered worker beyond its address: what it serves, where
// its KV events are published, and its speed prior.
type Template struct {
	Models []string // served model names; empty = any model
	// KVEventsEndpoint and KVEventsReplayEndpoint are ZMQ endpoint templates: {ip} is
	// the worker's IP ([v6] bracketed), {port} its KV events port. "" = none.
	KVEventsEndpoint       string
	KVEventsReplayEndpoint string
	Topic                  string
	Profile                Profile
	// Role is every discovered worker's prefill/decode role (EndpointSlices and DNS
	// records carry no pod labels: a prefill Service and a decode Service are two
	// sources, each with its role); RoleAggregated none.
	Role Role
}

// worker builds the worker at ip:httpPort; kvPort fills {port} in the templates
// (0 leaves templates that use {port} unset, since the endpoint would be wrong).
func (t Template) worker(name, ip string, httpPort, kvPort int) *Worker {
	w := &Worker{Name: name, Address: net.JoinHostPort(ip, strconv.Itoa(httpPort)),
		Models: append([]string(nil), t.Models...), Profile: t.Profile, Role: t.Role}
	w.KVEvents = KVEvents{Endpoint: expand(t.KVEventsEndpoint, ip, kvPort),
		ReplayEndpoint: expand(t.KVEventsReplayEndpoint, ip, kvPort), Topic: t.Topic}
	if w.KVEvents.Endpoint == "" {
		w.KVEvents.ReplayEndpoint = ""
	}
	return w
}

func expand(tmpl, ip string, port int) string {
	if tmpl == "" || (port == 0 && strings.Contains(tmpl, "{port}")) {
		return ""
	}
	host := ip
	if strings.Contains(ip, ":") {
		host = "[" + ip + "]"
	}
	return strings.NewReplacer("{ip}", host, "{port}", strconv.Itoa(port)).Replace(tmpl)
}

// Union merges the workers of several discovery sources with the static ones into one
// registry (e.g. a prefill Service and a decode Service, each a source with its
// Template.Role): a source's Set replaces its own share only. A worker named like an
// earlier one (the static ones first, then the sources in the order they first set)
// loses. Safe for concurrent use.
type Union struct {
	Registry *Registry
	Static   []*Worker

	mu    sync.Mutex
	order []string
	sets  map[string][]*Worker
}

// Set replaces source's workers with found and sets static ∪ every source's on the
// registry.
func (u *Union) Set(source string, found []*Worker) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sets == nil {
		u.sets = map[string][]*Worker{}
	}
	if _, ok := u.sets[source]; !ok {
		u.order = append(u.order, source)
	}
	u.sets[source] = found
	all := append([]*Worker(nil), u.Static...)
	for _, s := range u.order {
		all = append(all, u.sets[s]...)
	}
	u.Registry.Set(firstByName(all))
}

// firstByName drops, in order, every worker named like an earlier one.
func firstByName(ws []*Worker) []*Worker {
	out := ws[:0]
	seen := make(map[string]bool, len(ws))
	for _, w := range ws {
		if !seen[w.Name] {
			seen[w.Name] = true
			out = append(out, w)
		}
	}
	return out
}

// Sources runs several discovery sources at once (each into one Union); Run returns
// when every source has, with the first error (the others are cancelled then).
type Sources []Source

// Run implements Source.
func (ss Sources) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(ss))
	for _, s := range ss {
		go func() {
			err := s.Run(ctx)
			if err != nil {
				cancel()
			}
			errc <- err
		}()
	}
	var first error
	for range ss {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// applySnapshot sets static ∪ discovered on reg (a discovered worker named like a
// static one loses) — or, with u, found as source's share of the union — and records
// the refresh under source.
func applySnapshot(reg *Registry, static []*Worker, u *Union, found []*Worker, m *metrics.Workers, source string, now time.Time, ready, notReady int) {
	if u != nil {
		u.Set(source, found)
	} else {
		reg.Set(firstByName(append(append([]*Worker(nil), static...), found...)))
	}
	if m != nil {
		m.Discovered.WithLabelValues(source, "ready").Set(float64(ready))
		m.Discovered.WithLabelValues(source, "not_ready").Set(float64(notReady))
		m.Refreshes.WithLabelValues(source).Inc()
		m.LastRefresh.WithLabelValues(source).Set(float64(now.UnixNano()) / 1e9)
	}
}

func countError(m *metrics.Workers, source, reason string) {
	if m != nil {
		m.Errors.WithLabelValues(source, reason).Inc()
	}
}
