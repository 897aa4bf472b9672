package sim

import (
	"errors"
	"slices"
)

// ErrNoLoRA is returned by Add for an adapter request to an engine without LoRA slots
// (Profile.MaxLoRAs 0: vLLM without --enable-lora answers 404 for the adapter name).
var ErrNoLoRA = errors.New("sim: LoRA adapter requested but the engine has no LoRA slots (max_loras 0)")

// The engine models vLLM's LoRA serving: Profile.MaxLoRAs GPU slots held least
// recently used first (vllm/lora/worker_manager.py LRUCacheWorkerLoRAManager), a
// missing adapter loaded into a free slot or in place of the least recently used idle
// one, the load adding Profile.LoRALoadTime to the step that runs it; and the
// scheduler's rule that one step runs at most max_loras distinct adapters: a waiting
// request of a further adapter is skipped until one of them has no running request
// (vllm/v1/core/sched/scheduler.py, scheduled_loras).

// loraFits reports whether a waiting request of adapter may join this step.
func (e *Engine) loraFits(adapter string) bool {
	if adapter == "" {
		return true
	}
	n := 0
	seen := make([]string, 0, e.prof.MaxLoRAs)
	for _, s := range e.running {
		if a := s.req.LoRA; a != "" && !slices.Contains(seen, a) {
			if a == adapter {
				return true
			}
			seen = append(seen, a)
			n++
		}
	}
	return n < e.prof.MaxLoRAs
}

// useLoRA marks adapter most recently used, loading it (evicting the least recently
// used adapter no running request holds) when it is not in a slot, and reports
// whether it loaded. loraFits guarantees a slot can be had.
func (e *Engine) useLoRA(adapter string) bool {
	if adapter == "" {
		return false
	}
	if i := slices.Index(e.slots, adapter); i >= 0 {
		e.slots = append(append(e.slots[:i:i], e.slots[i+1:]...), adapter)
		return false
	}
	if len(e.slots) >= e.prof.MaxLoRAs {
		for i, a := range e.slots {
			if !slices.ContainsFunc(e.running, func(s *seq) bool { return s.req.LoRA == a }) {
				e.slots = append(e.slots[:i], e.slots[i+1:]...)
				break
			}
		}
	}
	e.slots = append(e.slots, adapter)
	e.stats.LoRALoads++
	return true
}

// adaptersOf lists the distinct adapters of seqs in order of first appearance.
func adaptersOf(seqs []*seq) []string {
	var out []string
	for _, s := range seqs {
		if a := s.req.LoRA; a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// LoRASlots returns the adapters held in GPU slots, least recently used first.
func (e *Engine) LoRASlots() []string { return slices.Clone(e.slots) }
