package bench

import (
	"container/list"
	"sort"

	"github.com/kvroute/kvroute/kvindex"
)

// chains groups a workload into sequences run one after the other: each conversation
// (turns in order) and each standalone item, ordered by the first item's arrival.
func chains(w *Workload) [][]int {
	var out [][]int
	conv := map[int]int{}
	for i, it := range w.Items {
		if it.Conv < 0 {
			out = append(out, []int{i})
			continue
		}
		c, ok := conv[it.Conv]
		if !ok {
			c = len(out)
			conv[it.Conv] = c
			out = append(out, nil)
		}
		out[c] = append(out[c], i)
	}
	for _, c := range out {
		sort.SliceStable(c, func(a, b int) bool { return w.Items[c[a]].Turn < w.Items[c[b]].Turn })
	}
	sort.SliceStable(out, func(a, b int) bool { return w.Items[out[a][0]].At < w.Items[out[b][0]].At })
	return out
}

// HitBound is the cache-hit ratio of one infinite prefix cache serving the whole
// workload in arrival order: hits are block aligned and at most prompt length − 1, as
// in vLLM. It bounds what any placement over finite workers can reach (generated
// tokens are not counted, as the workload does not know them).
func HitBound(w *Workload, blockSize int) float64 { return HitBoundLRU(w, blockSize, 0) }

// HitBoundLRU is HitBound for one pooled LRU cache of capacity blocks (0: infinite),
// e.g. the whole cluster's KV capacity as if it were one worker. Not a strict bound
// (a pooled LRU is not optimal), but a fair reference when the infinite cache is far
// out of reach.
func HitBoundLRU(w *Workload, blockSize, capacity int) float64 {
	seen := map[kvindex.Key]*list.Element{}
	lru := list.New() // front = most recently used
	var prompt, hit int
	order := make([]int, 0, len(w.Items))
	for _, c := range chains(w) {
		order = append(order, c...)
	}
	sort.SliceStable(order, func(a, b int) bool {
		ia, ib := &w.Items[order[a]], &w.Items[order[b]]
		if ia.Conv >= 0 && ia.Conv == ib.Conv {
			return ia.Turn < ib.Turn
		}
		return ia.At < ib.At
	})
	var keys []kvindex.Key
	for _, i := range order {
		toks := w.Items[i].EngineTokens()
		keys = kvindex.HashBlocks(0, toks, blockSize, keys[:0])
		limit := (len(toks) - 1) / blockSize
		n := 0
		for n < limit && n < len(keys) {
			if _, ok := seen[keys[n]]; !ok {
				break
			}
			n++
		}
		hit += n * blockSize
		prompt += len(toks)
		for _, k := range keys {
			if e, ok := seen[k]; ok {
				lru.MoveToFront(e)
				continue
			}
			seen[k] = lru.PushFront(k)
			if capacity > 0 && lru.Len() > capacity {
				old := lru.Back()
				delete(seen, old.Value.(kvindex.Key))
				lru.Remove(old)
			}
		}
	}
	if prompt == 0 {
		return 0
	}
	return float64(hit) / float64(prompt)
}

// ExtraPrefillTokens is how many more prompt tokens the workers prefilled in rs than one
// infinite cache would over the same workload (bound = HitBound): (bound − hit ratio) ×
// prompt tokens, where the hit ratio is the workers' own cached tokens ÷ prompt tokens.
// Duplicate cold prefills of one prefix on several workers, and re-prefills after
// evictions, both count.
func ExtraPrefillTokens(rs []Result, bound float64) int {
	prompt, cached := 0, 0
	for _, r := range rs {
		prompt += r.PromptTokens
		cached += r.CachedTokens
	}
	return int(bound*float64(prompt)) - cached
}
