package scoring

import (
	"slices"
	"strings"
	"time"
)

// AdapterState is where a worker stands with a request's LoRA adapter.
//
// vLLM holds at most max_loras adapters in GPU slots, least recently used replaced
// first, and loads a missing one before the request's first step
// (vllm/lora/worker_manager.py LRUCacheWorkerLoRAManager); its scheduler schedules a
// waiting request whose adapter is not in the step only while fewer than max_loras
// distinct adapters are (vllm/v1/core/sched/scheduler.py, "max_loras"), so a request
// whose adapter would be one too many waits for a running adapter's requests to end.
type AdapterState int

const (
	AdapterNone     AdapterState = iota // base-model request, or the worker exports no LoRA state
	AdapterLoaded                       // the adapter is in one of the worker's slots
	AdapterFreeSlot                     // not loaded; a slot is free: one load
	AdapterEvict                        // not loaded; every slot holds an adapter, some idle: one load in place of the least recent
	AdapterBlocked                      // not loaded; every slot's adapter has running requests: a load after a slot frees
)

var adapterStateNames = [...]string{"none", "loaded", "free_slot", "evict", "blocked"}

// String returns the state's metric label.
func (s AdapterState) String() string { return adapterStateNames[s] }

// maxAdapterMemory bounds the adapters a worker model remembers (beyond its slots).
const maxAdapterMemory = 256

// adapterUse is when an adapter was last used on a worker as far as this policy knows:
// its own picks, and the scrapes that listed it running or waiting.
type adapterUse map[string]time.Time

// touch records a use of adapter at t (a later use wins), forgetting the oldest
// beyond maxAdapterMemory.
func (u adapterUse) touch(adapter string, t time.Time) {
	if old, ok := u[adapter]; ok && !t.After(old) {
		return
	}
	u[adapter] = t
	if len(u) > maxAdapterMemory {
		oldest, at := "", time.Time{}
		for a, ts := range u {
			if oldest == "" || ts.Before(at) {
				oldest, at = a, ts
			}
		}
		delete(u, oldest)
	}
}

// adapterState classifies candidate c for in.Adapter: the worker's slots hold the
// adapters its last scrape listed running or waiting, then the ones this policy used
// there most recently, up to max_loras. The slots are all busy when as many distinct
// adapters ran at the scrape or were sent there by this policy since.
func adapterState(in *Input, c *Candidate, used adapterUse) AdapterState {
	a := c.Load.Adapters
	if in.Adapter == "" || !a.Known() {
		return AdapterNone
	}
	if a.Has(in.Adapter) {
		return AdapterLoaded
	}
	resident := make([]string, 0, a.MaxLoRAs+4)
	add := func(n string) {
		if !slices.Contains(resident, n) {
			resident = append(resident, n)
		}
	}
	for _, n := range a.Running {
		add(n)
	}
	for _, n := range a.Waiting {
		add(n)
	}
	busy := len(resident)
	if len(resident) < a.MaxLoRAs && len(used) > 0 {
		recent := make([]string, 0, len(used))
		for n := range used {
			recent = append(recent, n)
		}
		slices.SortFunc(recent, func(x, y string) int {
			if c := used[y].Compare(used[x]); c != 0 {
				return c // most recent first
			}
			return strings.Compare(x, y)
		})
		for _, n := range recent {
			if len(resident) >= a.MaxLoRAs {
				break
			}
			if !slices.Contains(resident, n) {
				resident = append(resident, n)
				if used[n].After(c.Load.ScrapedAt) {
					busy++ // sent there after the scrape: assume still running
				}
			}
		}
	}
	switch {
	case slices.Contains(resident, in.Adapter):
		return AdapterLoaded
	case len(resident) < a.MaxLoRAs:
		return AdapterFreeSlot
	case busy >= a.MaxLoRAs:
		return AdapterBlocked
	}
	return AdapterEvict
}

// adapterCost is the prior time state adds to the request's TTFT, seconds: one
// Options.AdapterLoadTime for a load, plus Options.AdapterSlotWait when the load must
// wait for a slot.
func adapterCost(o *Options, s AdapterState) float64 {
	switch s {
	case AdapterFreeSlot, AdapterEvict:
		return o.AdapterLoadTime.Seconds()
	case AdapterBlocked:
		return (o.AdapterLoadTime + o.AdapterSlotWait).Seconds()
	}
	return 0
}

// recordAdapter notes, for the chosen worker, the adapters its scrape listed and the
// one just sent there (p.mu held for writing).
func (wm *workerModel) recordAdapter(in *Input, c *Candidate) {
	if in.Adapter == "" {
		return
	}
	if wm.adapters == nil {
		wm.adapters = adapterUse{}
	}
	if !c.Load.ScrapedAt.IsZero() {
		for _, n := range c.Load.Adapters.Running {
			wm.adapters.touch(n, c.Load.ScrapedAt)
		}
		for _, n := range c.Load.Adapters.Waiting {
			wm.adapters.touch(n, c.Load.ScrapedAt)
		}
	}
	wm.adapters.touch(in.Adapter, in.Now)
}

// displacement is the price, beyond its own TTFT, of a pick that loads the adapter in
// place of another: the evicted adapter's next request pays a load (the same argument
// as the cache-turnover price, for adapter slots), seconds at the learned factor theta.
// A load into a free slot or a wait for a running slot displaces nothing.
func displacement(o *Options, s AdapterState, theta float64) float64 {
	if s != AdapterEvict {
		return 0
	}
	return theta * o.AdapterLoadTime.Seconds()
}
