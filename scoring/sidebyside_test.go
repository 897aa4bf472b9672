package scoring_test

import (
	"container/heap"
	"container/list"
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// toyWorker is a deliberately small model of one vLLM worker, for a sanity check of the
// policies' relative quality (the simulator issue owns the real comparison): FCFS
// prefill at a fixed rate, a fixed overhead, an LRU prefix cache of whole blocks.
// Decode is ignored. Because service is FCFS, a request's cache state at its start is
// the cache after every request queued before it, so blocks are inserted at enqueue.
type toyWorker struct {
	name  string
	rate  float64 // prefill tokens/s
	free  time.Time
	cache *toyLRU
}

type toyLRU struct {
	cap   int
	order *list.List // front = most recent
	pos   map[kvindex.Key]*list.Element
}

func newToyLRU(capacity int) *toyLRU {
	return &toyLRU{cap: capacity, order: list.New(), pos: map[kvindex.Key]*list.Element{}}
}

func (l *toyLRU) leading(keys []kvindex.Key) int {
	for i, k := range keys {
		if _, ok := l.pos[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// add inserts keys (most recent last) and returns the evicted ones.
func (l *toyLRU) add(keys []kvindex.Key) (evicted []kvindex.Key) {
	for _, k := range keys {
		if e, ok := l.pos[k]; ok {
			l.order.MoveToFront(e)
			continue
		}
		l.pos[k] = l.order.PushFront(k)
	}
	for l.order.Len() > l.cap {
		e := l.order.Back()
		l.order.Remove(e)
		k := e.Value.(kvindex.Key)
		delete(l.pos, k)
		evicted = append(evicted, k)
	}
	return evicted
}

type done struct {
	at   time.Time
	tk   *router.Ticket
	w    string
	keys []kvindex.Key
}
type doneHeap []done

func (h doneHeap) Len() int           { return len(h) }
func (h doneHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h doneHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *doneHeap) Push(x any)        { *h = append(*h, x.(done)) }
func (h *doneHeap) Pop() any          { o := *h; x := o[len(o)-1]; *h = o[:len(o)-1]; return x }

type toyResult struct {
	meanTTFT, p90TTFT time.Duration
	hitRatio          float64
}

// runToy replays a shared-prefix workload (32 groups of requests sharing a 2,048-token
// prefix plus a unique 256-token suffix, Poisson arrivals at qps; each worker's cache of
// 1,200 blocks holds about 9 of the 32 prefixes, so placement matters) through a real router
// with policy over toy workers, in virtual time. rates are the workers' true prefill
// rates; every worker's profile claims 5000 tok/s.
func runToy(t testing.TB, policy string, rates []float64, qps float64, n int) toyResult {
	const bs, prefix, suffix, groups = 16, 2048, 256, 32
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	reg := workers.NewRegistry()
	ws := map[string]*toyWorker{}
	var list []*workers.Worker
	for i, r := range rates {
		name := fmt.Sprintf("w%d", i)
		list = append(list, &workers.Worker{Name: name, Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"m"}})
		ws[name] = &toyWorker{name: name, rate: r, free: now, cache: newToyLRU(1200)}
	}
	reg.Set(list)
	ix := kvindex.New(kvindex.Options{SpeculativeTTL: 30 * time.Second, Now: clock})
	pol, err := scoring.New(policy, scoring.Options{Rand: rand.New(rand.NewPCG(7, 7))})
	if err != nil {
		t.Fatal(err)
	}
	r := router.New(router.Options{Registry: reg, Index: ix, Policy: pol, Models: []router.Model{{Name: "m", BlockSize: bs}}, Now: clock})
	rng := rand.New(rand.NewPCG(11, 11))
	seed := kvindex.Namespace{Model: "m"}.Seed()
	var pending doneHeap
	var ttfts []time.Duration
	hit, total := 0, 0
	drain := func(until time.Time) {
		for pending.Len() > 0 && !pending[0].at.After(until) {
			d := heap.Pop(&pending).(done)
			now = d.at
			d.tk.FirstToken(d.at)
			d.tk.Done(200, responseUsage(), d.at)
			ix.Store(d.w, kvindex.TierGPU, d.keys)
		}
	}
	at := now
	for i := 0; i < n; i++ {
		at = at.Add(time.Duration(rng.ExpFloat64() / qps * float64(time.Second)))
		drain(at)
		now = at
		toks := append(tokens(rng.IntN(groups), prefix), tokens(100000+i, suffix)...)
		tk, err := r.Pick(context.Background(), completion(toks), router.PickOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w := ws[tk.Worker]
		keys := kvindex.HashBlocks(seed, toks, bs, nil)
		cached := min(w.cache.leading(keys)*bs, len(toks)-1)
		if ev := w.cache.add(keys); len(ev) > 0 {
			ix.Remove(w.name, ev)
		}
		hit += cached
		total += len(toks)
		start := at
		if w.free.After(start) {
			start = w.free
		}
		finish := start.Add(20*time.Millisecond + time.Duration(float64(len(toks)-cached)/w.rate*float64(time.Second)))
		w.free = finish
		ttfts = append(ttfts, finish.Sub(at))
		heap.Push(&pending, done{at: finish, tk: tk, w: w.name, keys: keys})
	}
	drain(at.Add(time.Hour))
	sort.Slice(ttfts, func(i, j int) bool { return ttfts[i] < ttfts[j] })
	var sum time.Duration
	for _, d := range ttfts {
		sum += d
	}
	return toyResult{meanTTFT: sum / time.Duration(len(ttfts)), p90TTFT: ttfts[len(ttfts)*9/10], hitRatio: float64(hit) / float64(total)}
}

// TestToySideBySide is a sanity check, not the benchmark: on a toy FCFS model with a
// shared-prefix workload, kvroute's mean TTFT must beat the cache-unaware baselines
// (random, round_robin, least_request), at an unsaturated and a loaded point, on
// homogeneous workers and on a heterogeneous pool whose profiles are wrong (one worker
// is really 3× faster than configured, one 2× slower). Every policy's numbers are logged.
func TestToySideBySide(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("toy side-by-side replay: skipped with -short and -race")
	}
	for _, sc := range []struct {
		name  string
		rates []float64
		qps   float64
	}{
		{"homogeneous/unsaturated", []float64{5000, 5000, 5000, 5000}, 3},
		{"homogeneous/loaded", []float64{5000, 5000, 5000, 5000}, 9},
		{"heterogeneous/loaded", []float64{15000, 5000, 5000, 2500}, 9},
	} {
		t.Run(sc.name, func(t *testing.T) {
			res := map[string]toyResult{}
			var b strings.Builder
			fmt.Fprintf(&b, "%-22s %10s %10s %6s\n", "policy", "mean TTFT", "p90 TTFT", "hit")
			for _, p := range scoring.PolicyNames {
				res[p] = runToy(t, p, sc.rates, sc.qps, 800)
				fmt.Fprintf(&b, "%-22s %10s %10s %5.0f%%\n", p, res[p].meanTTFT.Round(time.Millisecond), res[p].p90TTFT.Round(time.Millisecond), res[p].hitRatio*100)
			}
			t.Logf("%s (qps %.0f):\n%s", sc.name, sc.qps, b.String())
			for _, base := range []string{scoring.PolicyRandom, scoring.PolicyRoundRobin, scoring.PolicyLeastRequest} {
				if res[scoring.PolicyKVRoute].meanTTFT >= res[base].meanTTFT {
					t.Errorf("kvroute mean TTFT %v must beat %s's %v", res[scoring.PolicyKVRoute].meanTTFT, base, res[base].meanTTFT)
				}
			}
		})
	}
}
