package admission

import "sync"

// Other is the tenant label value of every tenant without its own.
const Other = "other"

// DefaultClass is the class label value of a request without a QoS class.
const DefaultClass = "default"

// Labeler bounds the tenant label's cardinality: tenants in the allowlist and the first
// max others seen keep their name; every other tenant is Other. Safe for concurrent use.
type Labeler struct {
	allow map[string]bool
	max   int

	mu   sync.RWMutex
	seen map[string]bool
}

// NewLabeler returns a Labeler for allow plus the first max tenants seen.
func NewLabeler(allow []string, max int) *Labeler {
	l := &Labeler{allow: map[string]bool{}, max: max, seen: map[string]bool{}}
	for _, t := range allow {
		l.allow[t] = true
	}
	return l
}

// Label returns tenant's label value.
func (l *Labeler) Label(tenant string) string {
	if l.allow[tenant] || tenant == Unattributed {
		return tenant
	}
	l.mu.RLock()
	ok, n := l.seen[tenant], len(l.seen)
	l.mu.RUnlock()
	if ok {
		return tenant
	}
	if n >= l.max {
		return Other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[tenant] {
		return tenant
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[tenant] = true
	return tenant
}

// Labels returns the label values {tenant, class} of every per-tenant metric
// (metrics.Admission): tenant bounded by Label, class as given or DefaultClass when
// "" (class names come from configuration, so they are bounded). It is the one place
// that decides both.
func (l *Labeler) Labels(tenant, class string) [2]string {
	if class == "" {
		class = DefaultClass
	}
	return [2]string{l.Label(tenant), class}
}
