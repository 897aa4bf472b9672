package kvindex

// WorkerSummary is the debug view of one worker's index state (GET /debug/index).
type WorkerSummary struct {
	Worker        string         `json:"worker"`
	Model         string         `json:"model"`             // namespace model
	BlockSize     int            `json:"block_size"`        // configured block size, tokens
	Mode          string         `json:"mode"`              // exact, approximate, none
	Events        bool           `json:"events"`            // KV events expected
	BlockCapacity int            `json:"block_capacity"`    // 0 unknown
	Ranks         map[int]int    `json:"ranks"`             // data-parallel rank → engine entries
	EngineEntries int            `json:"engine_entries"`    // (rank, engine hash) entries
	ByTier        map[string]int `json:"by_tier"`           // engine entries per tier held
	Speculative   int            `json:"speculative"`       // live speculative entries
	Batches       uint64         `json:"batches"`           // batches applied since added or reset
	Desynced      bool           `json:"desynced"`          // events lost, waiting for coverage
	CoverLeft     int            `json:"cover_left_blocks"` // blocks still to store to leave approximate mode
	SkippedGroups []int          `json:"skipped_groups,omitempty"`
	// Failing: its last FailingAfter or more BlockStored events failed to apply.
	Failing bool `json:"failing"`
	// LastEventAge is the time since its last event batch was applied, seconds; nil
	// when none was.
	LastEventAge *float64 `json:"last_event_age_s"`
}

// Summary returns worker's debug summary, or false for an unknown worker. It holds the
// worker's lock (which writers and Speculate need) only to copy counters: O(ranks +
// KV cache groups), never O(entries) — debug views must not stall routing.
func (ix *Index) Summary(name string) (WorkerSummary, bool) {
	w := ix.worker(name)
	if w == nil {
		return WorkerSummary{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := WorkerSummary{Worker: w.name, Model: w.seedModel, BlockSize: w.blockSize, Mode: ix.modeLocked(w).String(),
		Events: w.info.Events, BlockCapacity: w.info.BlockCapacity, Ranks: map[int]int{}, ByTier: map[string]int{},
		EngineEntries: w.nEng, Speculative: w.specLive, Batches: w.batches, Desynced: w.desyncGen != 0}
	s.Failing = w.failing
	if !w.lastEvent.IsZero() {
		age := ix.opt.Now().Sub(w.lastEvent).Seconds()
		s.LastEventAge = &age
	}
	if s.Desynced {
		s.CoverLeft = max(w.staleUntil-w.stored, 0)
	}
	for n, r := range w.ranks {
		s.Ranks[n] = r.len()
	}
	for t, n := range w.tierEng {
		if n > 0 {
			s.ByTier[Tier(t).String()] = n
		}
	}
	for g, ok := range w.groups {
		if !ok {
			s.SkippedGroups = append(s.SkippedGroups, g)
		}
	}
	return s, true
}

// Workers returns the names of indexed workers.
func (ix *Index) Workers() []string {
	ix.wmu.Lock()
	defer ix.wmu.Unlock()
	out := make([]string, 0, len(ix.byName))
	for n := range ix.byName {
		out = append(out, n)
	}
	return out
}
