package scoring

import (
	"math/rand/v2"
	"sync"

	"github.com/kvroute/kvroute/metrics"
)

// SGLang re-implements the SGLang model gateway's cache-aware policy from its
// documentation (not its code): docs/concepts/routing/cache-aware.md of
// lightseekorg/smg (the SGLang router's successor) and the sgl-router README.
//
//  1. An approximate radix tree on request *text* remembers which worker each prompt
//     was sent to (radix.go); each worker's share is capped (SGLMaxTreeChars, LRU leaves
//     evicted).
//  2. Load = requests the router has in flight per worker. The system is imbalanced
//     when (max − min) > balance_abs_threshold AND max > balance_rel_threshold × min;
//     then the least-loaded worker wins (shortest queue).
//  3. Otherwise, when the longest match covers more than cache_threshold of the prompt,
//     the worker holding it wins (several: least loaded); else the least-loaded worker.
//  4. The prompt is inserted into the chosen worker's part of the tree.
type SGLang struct {
	b   Baselines
	rng *rand.Rand
	m   *metrics.Scoring

	mu   sync.Mutex // guards tree
	tree *radix
}

func newSGLang(o Options) *SGLang {
	return &SGLang{b: o.Baselines, rng: o.Rand, m: o.Metrics, tree: newRadix()}
}

// Name implements Policy.
func (p *SGLang) Name() string { return PolicySGLang }

// Pick implements Policy.
func (p *SGLang) Pick(in *Input, cands []Candidate) Decision {
	countPick(p.m, in, PolicySGLang)
	text := PromptText(in)
	load := func(i int) float64 { return float64(cands[i].Booked.Requests) }
	minL, maxL := load(0), load(0)
	for i := range cands {
		minL, maxL = min(minL, load(i)), max(maxL, load(i))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	best := -1
	if !(maxL-minL > p.b.SGLBalanceAbs && maxL > p.b.SGLBalanceRel*minL) && len(text) > 0 {
		n, holders := p.tree.match(text)
		if float64(n)/float64(len(text)) > p.b.SGLCacheThreshold {
			const inf = 1e300
			best = minRandom(p.rng, len(cands), func(i int) float64 {
				if _, ok := holders[cands[i].Worker.Name]; !ok {
					return inf
				}
				return load(i)
			})
			if _, ok := holders[cands[best].Worker.Name]; !ok {
				best = -1 // the holders are not candidates (unhealthy, other model)
			}
		}
	}
	if best < 0 {
		best = minRandom(p.rng, len(cands), load)
	}
	if !in.DryRun && len(text) > 0 {
		name := cands[best].Worker.Name
		p.tree.insert(text, name)
		p.tree.evict(name, p.b.SGLMaxTreeChars)
	}
	return Decision{Index: best, Reason: ReasonPolicy}
}
