package scoring

import "sort"

// radix is an approximate, multi-tenant radix tree over prompt text, in the manner of
// the SGLang router's cache-aware policy: every node records which workers (tenants)
// were sent a prompt passing through it, and when. It is not safe for concurrent use.
type radix struct {
	root *rnode
	size map[string]int // tenant → characters held
	tick int64          // logical clock (one per insert): no wall clock, so simulations replay
}

type rnode struct {
	edge     string
	parent   *rnode
	children map[byte]*rnode
	tenants  map[string]int64 // tenant → last insert tick through this node
}

func newRadix() *radix {
	return &radix{root: &rnode{children: map[byte]*rnode{}, tenants: map[string]int64{}}, size: map[string]int{}}
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// match returns the length of the longest prefix of text held by any tenant and the
// tenants holding that prefix.
func (t *radix) match(text string) (int, map[string]int64) {
	n, matched := t.root, 0
	holders := map[string]int64(nil)
	for matched < len(text) {
		c := n.children[text[matched]]
		if c == nil {
			break
		}
		k := commonPrefix(c.edge, text[matched:])
		if len(c.tenants) == 0 {
			break
		}
		matched += k
		holders = c.tenants
		if k < len(c.edge) {
			break
		}
		n = c
	}
	if holders == nil {
		return 0, nil
	}
	return matched, holders
}

// insert records that tenant was sent text.
func (t *radix) insert(text, tenant string) {
	t.tick++
	n, i := t.root, 0
	for i < len(text) {
		c := n.children[text[i]]
		if c == nil {
			leaf := &rnode{edge: text[i:], parent: n, children: map[byte]*rnode{}, tenants: map[string]int64{tenant: t.tick}}
			n.children[text[i]] = leaf
			t.size[tenant] += len(leaf.edge)
			return
		}
		k := commonPrefix(c.edge, text[i:])
		if k < len(c.edge) { // split c at k
			mid := &rnode{edge: c.edge[:k], parent: n, children: map[byte]*rnode{c.edge[k]: c}, tenants: make(map[string]int64, len(c.tenants))}
			for tn, tk := range c.tenants {
				mid.tenants[tn] = tk
			}
			n.children[text[i]] = mid
			c.edge, c.parent = c.edge[k:], mid
			c = mid
		}
		if _, ok := c.tenants[tenant]; !ok {
			t.size[tenant] += len(c.edge)
		}
		c.tenants[tenant] = t.tick
		i += k
		n = c
	}
}

// evict drops tenant's least recently inserted leaves until it holds at most maxChars.
func (t *radix) evict(tenant string, maxChars int) {
	if t.size[tenant] <= maxChars {
		return
	}
	var leaves []*rnode
	var walk func(n *rnode)
	walk = func(n *rnode) {
		leaf := true
		for _, c := range n.children {
			if _, ok := c.tenants[tenant]; ok {
				leaf = false
				walk(c)
			}
		}
		if leaf && n != t.root {
			leaves = append(leaves, n)
		}
	}
	walk(t.root)
	sort.Slice(leaves, func(i, j int) bool { return leaves[i].tenants[tenant] < leaves[j].tenants[tenant] })
	for len(leaves) > 0 && t.size[tenant] > maxChars {
		n := leaves[0]
		leaves = leaves[1:]
		for n != t.root && t.size[tenant] > maxChars {
			if _, ok := n.tenants[tenant]; !ok {
				break
			}
			// n is a leaf for tenant: no child holds tenant.
			delete(n.tenants, tenant)
			t.size[tenant] -= len(n.edge)
			p := n.parent
			if len(n.tenants) == 0 && len(n.children) == 0 {
				delete(p.children, n.edge[0])
			}
			still := false
			for _, c := range p.children {
				if _, ok := c.tenants[tenant]; ok {
					still = true
					break
				}
			}
			if still {
				break
			}
			n = p
		}
	}
}
