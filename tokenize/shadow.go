package tokenize

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/kvroute/request"
)

// The shadow check verifies local ids against the engine, continuously: for a sampled
// fraction of the requests served by the local path, after the pick and off the
// request path, the picked worker's POST /tokenize is asked for the same request and
// its ids compared with the local ones. Matches and mismatches are counted per model;
// the first mismatch of a model is logged once with its first differing position
// (never prompt text); past a mismatch rate the model is switched off its local path
// until a restart or ResetShadow: to its remote path when it has one (Health, the
// shadow_remote gauge), else to load-only picks, without prefix-cache scoring (the
// shadow_load_only gauge) — exact ids from nowhere beat wrong ids, which would score
// every worker's cache against blocks no engine holds.

// ShadowOptions configure the shadow check. Zero values select the defaults.
type ShadowOptions struct {
	// Fraction of local-path requests checked, per model; 0 means
	// DefaultShadowFraction, negative disables the check.
	Fraction float64
	// MaxPerSecond caps checks per model (a token bucket with a burst of one second's
	// worth, at least 1); 0 means DefaultShadowMaxPerSecond.
	MaxPerSecond float64
	// MismatchRate is the share of mismatching checks above which the model is
	// switched off its local path (to remote, or load-only without one), once MinChecks
	// checks were made; 0 means DefaultShadowMismatchRate.
	MismatchRate float64
	// MinChecks is the number of checks before the rate is judged; 0 means
	// DefaultShadowMinChecks.
	MinChecks int
	// Timeout bounds one check's calls to the worker; 0 means DefaultShadowTimeout.
	Timeout time.Duration
	// Concurrency bounds checks in flight over all models (more are dropped and
	// counted); 0 means DefaultShadowConcurrency.
	Concurrency int
}

// Shadow check defaults.
const (
	DefaultShadowFraction     = 0.01
	DefaultShadowMaxPerSecond = 1.0
	DefaultShadowMismatchRate = 0.05
	DefaultShadowMinChecks    = 20
	DefaultShadowTimeout      = 2 * time.Second
	DefaultShadowConcurrency  = 4
)

// Shadow check results (label values of kvroute_tokenize_shadow_checks_total).
const (
	ShadowMatch    = "match"
	ShadowMismatch = "mismatch"
	ShadowError    = "error"   // the worker's /tokenize failed; nothing compared
	ShadowDropped  = "dropped" // sampled, but Concurrency checks were already in flight
)

// ShadowHealth is one model's shadow check record, as /debug/tokenize shows it.
type ShadowHealth struct {
	Enabled    bool  `json:"enabled"`
	Matches    int64 `json:"matches"`
	Mismatches int64 `json:"mismatches"`
	Errors     int64 `json:"errors"`
	// Remote is true when the mismatch rate switched the model to its remote path;
	// LoadOnly when it switched a model without a remote path to load-only picks (its
	// requests get no ids: Path none, reason local_shadow_mismatch). Either lasts
	// until a restart or POST /debug/tokenize/reset.
	Remote      bool      `json:"remote"`
	LoadOnly    bool      `json:"load_only"`
	SwitchedAt  time.Time `json:"switched_at,omitzero"`
	LastDiffPos int       `json:"last_mismatch_position"` // first differing id of the last mismatch; -1 none
	LastLocal   int       `json:"last_mismatch_local_len,omitempty"`
	LastRemote  int       `json:"last_mismatch_remote_len,omitempty"`
}

// shadowState is a model's shadow record; guarded by Service.smu.
type shadowState struct {
	h      ShadowHealth
	tokens float64 // token bucket
	last   time.Time
	logged bool
}

// WithDefaults returns o with the value NewService gives each zero field (the
// DefaultShadow* constants); a negative Fraction stays negative (no checks).
func (o ShadowOptions) WithDefaults() ShadowOptions {
	o.defaults()
	return o
}

func (o *ShadowOptions) defaults() {
	if o.Fraction == 0 {
		o.Fraction = DefaultShadowFraction
	}
	if o.MaxPerSecond <= 0 {
		o.MaxPerSecond = DefaultShadowMaxPerSecond
	}
	if o.MismatchRate <= 0 {
		o.MismatchRate = DefaultShadowMismatchRate
	}
	if o.MinChecks <= 0 {
		o.MinChecks = DefaultShadowMinChecks
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultShadowTimeout
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultShadowConcurrency
	}
}

// shadowOff reports whether the shadow check switched the model off its local path.
func (s *Service) shadowOff(st *modelState) bool {
	s.smu.Lock()
	defer s.smu.Unlock()
	return st.shadow.h.Remote || st.shadow.h.LoadOnly
}

// Shadow is called by the router after a pick with the ids the local path produced
// (tokens: the first prompt's) and the picked worker's address. It returns at once:
// a sampled request is checked in its own goroutine. Requests served by other paths
// are not checked (pass path). Safe for concurrent use.
func (s *Service) Shadow(req *request.Request, path Path, tokens []uint32, addr string) {
	if path != PathLocal || s.shadowOpt.Fraction < 0 || addr == "" || req == nil {
		return
	}
	st := s.models[req.Model]
	if st == nil {
		return
	}
	if st.model != nil && st.model.IsHarmony() && req.API != request.APICompletions {
		// vLLM's /tokenize renders messages with the Hugging Face chat template
		// (apply_chat_template), not with harmony as its chat endpoint does: the two
		// are not comparable, and a "mismatch" would switch the model to a path that
		// is itself not the engine's prompt.
		return
	}
	if s.shadowOpt.Fraction < 1 && rand.Float64() >= s.shadowOpt.Fraction {
		return
	}
	now := s.now()
	s.smu.Lock()
	sh := &st.shadow
	if sh.h.Remote || sh.h.LoadOnly {
		s.smu.Unlock()
		return
	}
	burst := max(s.shadowOpt.MaxPerSecond, 1)
	if sh.last.IsZero() {
		sh.tokens = burst
	} else {
		sh.tokens = min(burst, sh.tokens+now.Sub(sh.last).Seconds()*s.shadowOpt.MaxPerSecond)
	}
	sh.last = now
	if sh.tokens < 1 {
		s.smu.Unlock()
		return
	}
	sh.tokens--
	s.smu.Unlock()
	select {
	case s.shadowSem <- struct{}{}:
	default:
		s.m.ShadowChecks.WithLabelValues(st.cfg.Name, ShadowDropped).Inc()
		return
	}
	s.shadowWG.Add(1)
	go func() {
		defer func() { <-s.shadowSem; s.shadowWG.Done() }()
		s.shadowCheck(st, req, tokens, addr)
	}()
}

// WaitShadow waits for the shadow checks in flight (tests, shutdown).
func (s *Service) WaitShadow() { s.shadowWG.Wait() }

func (s *Service) shadowCheck(st *modelState, req *request.Request, local []uint32, addr string) {
	name := st.cfg.Name
	bodies, err := remoteBodies(req)
	if err != nil || len(bodies) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.shadowOpt.Timeout)
	defer cancel()
	remote, why := s.callTokenize(ctx, addr, bodies[0])
	if why != "" {
		s.m.ShadowChecks.WithLabelValues(name, ShadowError).Inc()
		s.smu.Lock()
		st.shadow.h.Errors++
		s.smu.Unlock()
		return
	}
	d := firstDifference(local, remote)
	if d < 0 {
		s.m.ShadowChecks.WithLabelValues(name, ShadowMatch).Inc()
		s.smu.Lock()
		st.shadow.h.Matches++
		s.smu.Unlock()
		return
	}
	s.m.ShadowChecks.WithLabelValues(name, ShadowMismatch).Inc()
	s.smu.Lock()
	h := &st.shadow.h
	h.Mismatches++
	h.LastDiffPos, h.LastLocal, h.LastRemote = d, len(local), len(remote)
	first := !st.shadow.logged
	st.shadow.logged = true
	n := h.Matches + h.Mismatches
	switched := false
	if !h.Remote && !h.LoadOnly && n >= int64(s.shadowOpt.MinChecks) && float64(h.Mismatches)/float64(n) > s.shadowOpt.MismatchRate {
		h.SwitchedAt, switched = s.now(), true
		if slices.Contains(st.paths, PathRemote) {
			h.Remote = true
		} else {
			h.LoadOnly = true
		}
	}
	loadOnly := h.LoadOnly
	mm, rate := h.Mismatches, float64(h.Mismatches)/float64(n)
	s.smu.Unlock()
	if first {
		// Positions and lengths only: never prompt text (nor ids) at info level.
		s.log.Warn("shadow check: local token ids differ from the worker's /tokenize", "model", name, "worker", addr,
			"first_difference", d, "local_tokens", len(local), "worker_tokens", len(remote))
		s.log.Debug("shadow check mismatch detail", "model", name, "local_id", idAt(local, d), "worker_id", idAt(remote, d))
	}
	switch {
	case switched && loadOnly:
		s.m.ShadowLoadOnly.WithLabelValues(name).Set(1)
		s.log.Warn("shadow check: mismatch rate over the limit and the model has no remote tokenization path (models[].tokenize_paths); "+
			"its requests are now picked on load alone, without prefix-cache scoring, until restart or POST /debug/tokenize/reset",
			"model", name, "mismatches", mm, "checks", n, "rate", rate, "limit", s.shadowOpt.MismatchRate)
	case switched:
		s.m.ShadowRemote.WithLabelValues(name).Set(1)
		s.log.Warn("shadow check: mismatch rate over the limit; the model now uses its remote tokenization path until restart or POST /debug/tokenize/reset",
			"model", name, "mismatches", mm, "checks", n, "rate", rate, "limit", s.shadowOpt.MismatchRate)
	}
}

// ResetShadow clears the shadow record of model ("" = every model) and returns it to
// its configured paths. It reports whether the model is configured.
func (s *Service) ResetShadow(model string) bool {
	found := false
	s.smu.Lock()
	for name, st := range s.models {
		if model != "" && name != model {
			continue
		}
		found = true
		st.shadow = shadowState{h: ShadowHealth{Enabled: st.shadow.h.Enabled, LastDiffPos: -1}}
		s.m.ShadowRemote.WithLabelValues(name).Set(0)
		s.m.ShadowLoadOnly.WithLabelValues(name).Set(0)
	}
	s.smu.Unlock()
	return found
}

func idAt(ids []uint32, i int) int64 {
	if i < len(ids) {
		return int64(ids[i])
	}
	return -1
}

// firstDifference is the first index where a and b differ (the shorter length when
// one is a prefix of the other), or -1 when they are equal.
func firstDifference(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
