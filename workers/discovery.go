package workers

import (
	"context"
	"net"
	"strconv"
	"strings"
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
}

// worker builds the worker at ip:httpPort; kvPort fills {port} in the templates
// (0 leaves templates that use {port} unset, since the endpoint would be wrong).
func (t Template) worker(name, ip string, httpPort, kvPort int) *Worker {
	w := &Worker{Name: name, Address: net.JoinHostPort(ip, strconv.Itoa(httpPort)),
		Models: append([]string(nil), t.Models...), Profile: t.Profile}
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

// applySnapshot sets static ∪ discovered on reg (a discovered worker named like a
// static one loses) and records the refresh.
func applySnapshot(reg *Registry, static, found []*Worker, m *metrics.Workers, source string, now time.Time, ready, notReady int) {
	all := make([]*Worker, 0, len(static)+len(found))
	seen := map[string]bool{}
	for _, w := range static {
		seen[w.Name] = true
		all = append(all, w)
	}
	for _, w := range found {
		if !seen[w.Name] {
			seen[w.Name] = true
			all = append(all, w)
		}
	}
	reg.Set(all)
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
