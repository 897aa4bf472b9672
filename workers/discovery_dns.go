package workers

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/kvroute/kvroute/metrics"
)

// DefaultDNSInterval is the lookup period of a DNS source without one.
const DefaultDNSInterval = 30 * time.Second

// Resolver looks up a name's addresses; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DNS discovers workers as the A/AAAA records of one name, e.g. a Kubernetes headless
// Service ("vllm.default.svc.cluster.local") or a docker-compose service with replicas.
// Every address becomes a worker named "ip:port".
type DNS struct {
	Registry *Registry
	Name     string        // name to resolve
	HTTPPort int           // port of the HTTP API on every address
	KVPort   int           // fills {port} in the template's KV endpoints; 0 = none
	Interval time.Duration // lookup period; ≤ 0 means DefaultDNSInterval
	Template Template
	Static   []*Worker // always present besides the discovered ones
	// Union, when set, receives the discovered workers as this source's share (Source
	// names it: the source label of the discovery metrics, "" = "dns") instead of
	// Registry and Static: several sources into one registry.
	Union    *Union
	Source   string
	Resolver Resolver // nil = net.DefaultResolver
	Metrics  *metrics.Workers
	Logger   *slog.Logger
	Now      func() time.Time // nil = time.Now
}

// Run resolves at once and then every Interval until ctx is cancelled. A failed lookup
// is counted and logged, and the previous worker set stays.
func (d *DNS) Run(ctx context.Context) error {
	if d.Interval <= 0 {
		d.Interval = DefaultDNSInterval
	}
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		d.Refresh(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh does one lookup and applies its result; it reports whether it succeeded.
func (d *DNS) Refresh(ctx context.Context) bool {
	if d.Resolver == nil {
		d.Resolver = net.DefaultResolver
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	lctx, cancel := context.WithTimeout(ctx, max(d.Interval, time.Second))
	addrs, err := d.Resolver.LookupNetIP(lctx, "ip", d.Name)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		countError(d.Metrics, d.source(), DiscoveryErrorLookup)
		d.Logger.Warn("dns discovery: lookup failed; keeping the previous workers", "name", d.Name, "err", err)
		return false
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	addrs = slices.Compact(addrs)
	found := make([]*Worker, 0, len(addrs))
	for _, a := range addrs {
		ip := a.Unmap().String()
		w := d.Template.worker("", ip, d.HTTPPort, d.KVPort)
		w.Name = w.Address
		found = append(found, w)
	}
	applySnapshot(d.Registry, d.Static, d.Union, found, d.Metrics, d.source(), d.Now(), len(found), 0)
	return true
}

func (d *DNS) source() string {
	if d.Source != "" {
		return d.Source
	}
	return "dns"
}
