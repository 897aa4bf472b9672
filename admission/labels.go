package admission

import "sync"

// Other is the tenant label value of every tenant without its own.
const Other = "other"

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
