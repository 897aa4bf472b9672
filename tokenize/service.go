package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
)

// ModelConfig says how one served model is tokenized.
type ModelConfig struct {
	Name string // served model name, as clients send it
	// Tokenizer is the local directory (Hugging Face layout or hub cache entry); ""
	// means no local path. Loaded by NewService; a load error is kept and reported
	// (Health, metrics), and the local path then fails over to the next one.
	Tokenizer string
	// Paths are tried in order; each of PathLocal, PathRemote at most once. Empty means
	// [local, remote] when Tokenizer is set, else [remote].
	Paths []Path
	// RemoteTimeout bounds one call to the worker's /tokenize. 0 means
	// DefaultRemoteTimeout.
	RemoteTimeout time.Duration
	// RemoteBudget bounds the time one request spends on the remote path in all,
	// over every worker tried (up to maxRemoteTries). 0 means twice RemoteTimeout.
	RemoteBudget time.Duration
	// Model is a tokenizer already loaded (tests, the simulator); it takes precedence
	// over Tokenizer.
	Model *Model
	// Base names the base model of a LoRA adapter: without its own Tokenizer or Model,
	// the adapter uses the base model's loaded tokenizer.
	Base string
}

// DefaultRemoteTimeout bounds a remote /tokenize call when ModelConfig.RemoteTimeout is 0.
const DefaultRemoteTimeout = 250 * time.Millisecond

// WithDefaults returns mc with the value NewService gives each zero field: Paths
// [local, remote] with a tokenizer (Tokenizer, Model, or a Base to share), else
// [remote]; RemoteTimeout DefaultRemoteTimeout; RemoteBudget twice RemoteTimeout.
func (mc ModelConfig) WithDefaults() ModelConfig {
	if len(mc.Paths) == 0 {
		if mc.Tokenizer != "" || mc.Model != nil || mc.Base != "" {
			mc.Paths = []Path{PathLocal, PathRemote}
		} else {
			mc.Paths = []Path{PathRemote}
		}
	}
	if mc.RemoteTimeout <= 0 {
		mc.RemoteTimeout = DefaultRemoteTimeout
	}
	if mc.RemoteBudget <= 0 {
		mc.RemoteBudget = 2 * mc.RemoteTimeout
	}
	return mc
}

// ServiceOptions build a Service.
type ServiceOptions struct {
	Models []ModelConfig
	// Addresses returns the addresses ("ip:port") of the healthy workers serving model,
	// in the order the remote path should try them (callers rotate it to spread the
	// load). It takes precedence over Address.
	Addresses func(model string) []string
	// Address returns one worker address serving model; ok false when none is
	// available. Used when Addresses is nil (one worker per request, no second try).
	// Both nil disable the remote path.
	Address func(model string) (addr string, ok bool)
	Client  *http.Client      // nil: a client with no overall timeout (each call has its own)
	Metrics *metrics.Tokenize // nil: metrics.NewUnregistered().Tokenize
	Logger  *slog.Logger      // nil: slog.Default()
	Now     func() time.Time  // nil: time.Now
	Load    Options           // options for the models NewService loads
	// RemoteBackoff is how long the remote path skips a worker after
	// remoteFailureStreak consecutive failures of that worker (no /tokenize, down,
	// hung), so that it does not cost a failing round trip per request; the other
	// workers are asked meanwhile. Client errors (4xx) do not count. 0 means
	// DefaultRemoteBackoff; negative disables the backoff.
	RemoteBackoff time.Duration
	// Shadow configures the shadow check of local ids against the picked worker's
	// /tokenize (shadow.go).
	Shadow ShadowOptions
}

// DefaultRemoteBackoff is ServiceOptions.RemoteBackoff's default.
const DefaultRemoteBackoff = 5 * time.Second

// remoteFailureStreak consecutive failures of one worker start its backoff.
const remoteFailureStreak = 3

// maxRemoteTries is how many workers one request's remote path asks at most.
const maxRemoteTries = 3

// maxTrackedWorkers bounds the per-worker remote state (addresses come from the
// registry; past the bound the state of workers not seen lately is dropped).
const maxTrackedWorkers = 4096

// Service implements Tokenizer over per-model path chains: the request's own token ids
// (PathGiven), then the configured paths in order, then PathNone with a Degraded
// reason. It never returns an error: a request without ids is still routed (on load).
type Service struct {
	models  map[string]*modelState
	names   []string
	address func(string) (string, bool)
	client  *http.Client
	m       *metrics.Tokenize
	log     *slog.Logger
	now     func() time.Time
	backoff time.Duration
	addrs   func(string) []string

	wmu     sync.Mutex // guards workers
	workers map[string]*remoteWorker

	shadowOpt ShadowOptions
	smu       sync.Mutex // guards every modelState.shadow
	shadowSem chan struct{}
	shadowWG  sync.WaitGroup
}

// remoteWorker is one worker's remote tokenization record: streak counts its
// consecutive failures; at remoteFailureStreak it is skipped until skipUntil.
type remoteWorker struct {
	streak    int
	skipUntil time.Time
}

type modelState struct {
	cfg     ModelConfig
	model   *Model
	loadErr error
	paths   []Path

	mu      sync.Mutex // guards health, lastMod and lastRen
	health  map[Path]*PathHealth
	lastMod CacheStats
	lastRen RenderCacheStats // guarded by mu: the render cache's counters last moved into the metrics
	shadow  shadowState      // guarded by Service.smu
}

// PathHealth is one path's record for one model, as shown by /debug/tokenize.
type PathHealth struct {
	Path        Path      `json:"path"`
	Available   bool      `json:"available"` // local: tokenizer loaded; remote: an address function is set
	Detail      string    `json:"detail,omitempty"`
	Successes   int64     `json:"successes"`
	Failures    int64     `json:"failures"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastFailure time.Time `json:"last_failure,omitzero"`
	LastReason  string    `json:"last_reason,omitempty"`
}

// ModelHealth is one model's tokenization state.
type ModelHealth struct {
	Model     string       `json:"model"`
	Tokenizer string       `json:"tokenizer,omitempty"`
	Class     string       `json:"tokenizer_class,omitempty"`
	Chat      string       `json:"chat_template"` // "ok" or why chat requests cannot be rendered locally
	Paths     []PathHealth `json:"paths"`
	Cache     CacheStats   `json:"cache"`
	// Render is the render cache (incremental chat rendering, incremental.go).
	Render RenderCacheStats `json:"render_cache"`
	Shadow ShadowHealth     `json:"shadow"`
}

// Failure reasons (label values of kvroute_tokenize_failures_total and, for the last
// path tried, of kvroute_tokenize_degraded_total).
const (
	ReasonNoTokenizer = "no_tokenizer"     // local path without a loaded tokenizer
	ReasonNoTemplate  = "no_chat_template" // chat request, model has no usable template
	ReasonTemplate    = "template_error"   // the template raised or failed to render
	ReasonContent     = "unsupported_content"
	ReasonNoWorker    = "no_worker" // remote path without a worker address
	ReasonTimeout     = "timeout"
	ReasonHTTP        = "http_status"
	ReasonTransport   = "transport"
	ReasonDecode      = "bad_response"
	ReasonUnknown     = "unknown_model" // the request names a model with no configuration
	ReasonNoPath      = "no_path"       // the model has no path configured
	ReasonCanceled    = "canceled"
	ReasonBackoff     = "backoff" // every worker skipped after repeated failures
	// ReasonClient: the worker answered 4xx (the request's fault, e.g. a chat its
	// template refuses; 404, 405, 408 and 429 excepted). No backoff, no other worker:
	// the request is routed on load and the worker gives the client its own answer.
	ReasonClient = "client_error"
	// ReasonShadow: the local path is switched off because the shadow check found
	// too many mismatches with the workers' /tokenize (until restart or reset).
	ReasonShadow = "shadow_mismatch"
)

// NewService loads every configured model's tokenizer and returns the service. Load
// failures do not fail NewService; they are reported per model (Health, metrics) and
// the model uses its other paths. Validation errors (an unknown path name) do.
func NewService(opts ServiceOptions) (*Service, error) {
	s := &Service{models: map[string]*modelState{}, address: opts.Address, client: opts.Client,
		m: opts.Metrics, log: opts.Logger, now: opts.Now, backoff: opts.RemoteBackoff,
		addrs: opts.Addresses, workers: map[string]*remoteWorker{}, shadowOpt: opts.Shadow}
	s.shadowOpt.defaults()
	s.shadowSem = make(chan struct{}, s.shadowOpt.Concurrency)
	if s.addrs == nil && s.address != nil {
		s.addrs = func(model string) []string {
			if a, ok := s.address(model); ok && a != "" {
				return []string{a}
			}
			return nil
		}
	}
	if s.backoff == 0 {
		s.backoff = DefaultRemoteBackoff
	}
	if s.client == nil {
		s.client = &http.Client{}
	}
	if s.m == nil {
		s.m = metrics.NewUnregistered().Tokenize
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	// Base models first, so that adapters can share their loaded tokenizer.
	ordered := make([]ModelConfig, 0, len(opts.Models))
	for _, adapters := range []bool{false, true} {
		for _, mc := range opts.Models {
			if (mc.Base != "" && mc.Tokenizer == "" && mc.Model == nil) == adapters {
				ordered = append(ordered, mc)
			}
		}
	}
	for _, mc := range ordered {
		if _, dup := s.models[mc.Name]; dup {
			return nil, fmt.Errorf("tokenize: model %q configured twice", mc.Name)
		}
		mc = mc.WithDefaults()
		st := &modelState{cfg: mc, paths: mc.Paths, health: map[Path]*PathHealth{}}
		seen := map[Path]bool{}
		for _, p := range st.paths {
			if p != PathLocal && p != PathRemote {
				return nil, fmt.Errorf("tokenize: model %q: path %q is not local or remote", mc.Name, p)
			}
			if seen[p] {
				return nil, fmt.Errorf("tokenize: model %q: path %q listed twice", mc.Name, p)
			}
			seen[p] = true
			st.health[p] = &PathHealth{Path: p}
		}
		switch {
		case mc.Model != nil:
			st.model = mc.Model
		case mc.Tokenizer == "" && mc.Base != "" && s.models[mc.Base] != nil:
			st.model, st.loadErr = s.models[mc.Base].model, s.models[mc.Base].loadErr
		case mc.Tokenizer != "":
			st.model, st.loadErr = LoadModel(mc.Tokenizer, opts.Load)
			if st.loadErr != nil {
				s.log.Warn("tokenizer not loaded; the model uses its other tokenization paths", "model", mc.Name, "dir", mc.Tokenizer, "err", st.loadErr)
			}
		default:
			st.loadErr = fmt.Errorf("%w: no tokenizer directory configured", ErrNoTokenizer)
		}
		if h := st.health[PathLocal]; h != nil {
			h.Available = st.model != nil
			if st.loadErr != nil {
				h.Detail = st.loadErr.Error()
			}
		}
		if h := st.health[PathRemote]; h != nil {
			h.Available = s.addrs != nil
			if s.addrs == nil {
				h.Detail = "no worker address function"
			}
		}
		avail, chat := 0.0, 0.0
		if st.model != nil {
			avail = 1
			if st.model.ChatError() == nil {
				chat = 1
			}
		}
		st.shadow.h = ShadowHealth{Enabled: s.shadowOpt.Fraction >= 0 && st.model != nil && st.health[PathLocal] != nil, LastDiffPos: -1}
		s.m.ShadowRemote.WithLabelValues(mc.Name).Set(0)
		s.m.LocalAvailable.WithLabelValues(mc.Name).Set(avail)
		s.m.ChatTemplateUse.WithLabelValues(mc.Name).Set(chat)
		s.models[mc.Name] = st
		s.names = append(s.names, mc.Name)
	}
	sort.Strings(s.names)
	return s, nil
}

// Model returns the loaded local tokenizer of a configured model (nil if none).
func (s *Service) Model(name string) *Model {
	if st := s.models[name]; st != nil {
		return st.model
	}
	return nil
}

// Tokenize implements Tokenizer. It never returns an error; a request left without ids
// has Path PathNone and a Degraded reason.
func (s *Service) Tokenize(ctx context.Context, req *request.Request) (Result, error) {
	if res, ok := given(req); ok {
		label := req.Model
		if s.models[label] == nil {
			label = "other"
		}
		s.m.Requests.WithLabelValues(label, string(PathGiven)).Inc()
		s.m.Tokens.WithLabelValues(string(PathGiven)).Add(float64(res.PromptTokens))
		return res, nil
	}
	st := s.models[req.Model]
	if st == nil {
		s.m.Degraded.WithLabelValues("other", ReasonUnknown).Inc()
		s.m.Requests.WithLabelValues("other", string(PathNone)).Inc()
		return Result{Path: PathNone, Degraded: ReasonUnknown}, nil
	}
	reason := ReasonNoPath
	for _, p := range st.paths {
		start := s.now()
		var res Result
		var why string
		switch p {
		case PathLocal:
			if s.shadowOff(st) {
				why = ReasonShadow
			} else {
				res, why = s.local(st, req)
			}
		case PathRemote:
			res, why = s.remote(ctx, st, req)
		}
		s.m.Duration.WithLabelValues(string(p)).Observe(s.now().Sub(start).Seconds())
		if p == PathLocal {
			s.observeCache(st)
		}
		if why == "" {
			res.Path = p
			s.record(st, p, "")
			s.m.Requests.WithLabelValues(st.cfg.Name, string(p)).Inc()
			s.m.Tokens.WithLabelValues(string(p)).Add(float64(res.PromptTokens))
			return res, nil
		}
		s.record(st, p, why)
		s.m.Failures.WithLabelValues(st.cfg.Name, string(p), why).Inc()
		reason = string(p) + "_" + why
		if ctx.Err() != nil {
			reason = ReasonCanceled
			break
		}
	}
	s.m.Degraded.WithLabelValues(st.cfg.Name, reason).Inc()
	s.m.Requests.WithLabelValues(st.cfg.Name, string(PathNone)).Inc()
	return Result{Path: PathNone, Degraded: reason}, nil
}

// skipWorker reports whether the worker at addr is in remote backoff.
func (s *Service) skipWorker(addr string) bool {
	if s.backoff < 0 {
		return false
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := s.workers[addr]
	return w != nil && s.now().Before(w.skipUntil)
}

// workerOutcome tracks a worker's consecutive failures caused by the worker (not by
// the request or the caller) and starts its backoff after remoteFailureStreak.
func (s *Service) workerOutcome(addr, why string) {
	fault := false
	switch why {
	case "":
	case ReasonTimeout, ReasonTransport, ReasonHTTP, ReasonDecode:
		fault = true
	default: // client_error, canceled: the request's or the caller's doing
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := s.workers[addr]
	if w == nil {
		if !fault {
			return
		}
		if len(s.workers) >= maxTrackedWorkers {
			clear(s.workers)
		}
		w = &remoteWorker{}
		s.workers[addr] = w
	}
	if !fault {
		w.streak = 0
		return
	}
	w.streak++
	if w.streak >= remoteFailureStreak && s.backoff > 0 {
		w.skipUntil = s.now().Add(s.backoff)
		w.streak = 0
	}
}

func (s *Service) record(st *modelState, p Path, why string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	h := st.health[p]
	if why == "" {
		h.Successes++
		h.LastSuccess = s.now()
		return
	}
	h.Failures++
	h.LastFailure = s.now()
	h.LastReason = why
}

// observeCache moves the model's cache counters into the metrics as deltas.
func (s *Service) observeCache(st *modelState) {
	if st.model == nil {
		return
	}
	cs, rs := st.model.CacheStats(), st.model.RenderCacheStats()
	st.mu.Lock()
	prev, prevR := st.lastMod, st.lastRen
	st.lastMod, st.lastRen = cs, rs
	st.mu.Unlock()
	name := st.cfg.Name
	for _, c := range []struct {
		v         *prometheus.CounterVec
		now, last int64
	}{
		{s.m.CacheHits, cs.Hits, prev.Hits}, {s.m.CacheMisses, cs.Misses, prev.Misses},
		{s.m.CacheHitBytes, cs.HitTextBytes, prev.HitTextBytes}, {s.m.CacheEvictions, cs.Evictions, prev.Evictions},
		{s.m.RenderHits, rs.Hits, prevR.Hits}, {s.m.RenderMisses, rs.Misses, prevR.Misses},
		{s.m.RenderEvictions, rs.Evictions, prevR.Evictions}, {s.m.RenderDisagreements, rs.Disagreements, prevR.Disagreements},
	} {
		if d := c.now - c.last; d > 0 {
			c.v.WithLabelValues(name).Add(float64(d))
		}
	}
	s.m.CacheBytes.WithLabelValues(name).Set(float64(cs.Bytes))
	s.m.RenderBytes.WithLabelValues(name).Set(float64(rs.Bytes))
	off := 0.0
	if rs.Off {
		off = 1
	}
	s.m.RenderOff.WithLabelValues(name).Set(off)
}

// local tokenizes in process. why is "" on success, else a failure reason.
func (s *Service) local(st *modelState, req *request.Request) (Result, string) {
	m := st.model
	if m == nil {
		return Result{}, ReasonNoTokenizer
	}
	ids, err := LocalTokens(m, req)
	if err != nil {
		switch {
		case errors.Is(err, ErrNoTemplate):
			return Result{}, ReasonNoTemplate
		case errors.Is(err, ErrContent):
			return Result{}, ReasonContent
		default:
			return Result{}, ReasonTemplate
		}
	}
	n := 0
	for _, p := range ids {
		n += len(p)
	}
	return Result{Tokens: ids[0], PromptTokens: n}, ""
}

// LocalTokens tokenizes a request with m as vLLM would: chat and messages requests are
// rendered with the chat template and encoded with add_special_tokens (default
// false); each completions prompt is encoded with add_special_tokens (default true).
// It returns one id list per prompt (one for chat).
func LocalTokens(m *Model, req *request.Request) ([][]uint32, error) {
	switch req.API {
	case request.APIChat, request.APIMessages:
		if m.harmony != nil {
			// Harmony renders ids directly; add_special_tokens does not apply.
			ids, _, err := m.RenderHarmony(req)
			if err != nil {
				return nil, err
			}
			return [][]uint32{ids}, nil
		}
		add := false
		if req.AddSpecialTokens != nil {
			add = *req.AddSpecialTokens
		}
		ids, err := m.chatIDs(req, add)
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	case request.APICompletions:
		if len(req.Prompts) == 0 {
			return nil, fmt.Errorf("%w: completions request without a prompt", ErrContent)
		}
		add := true
		if req.AddSpecialTokens != nil {
			add = *req.AddSpecialTokens
		}
		out := make([][]uint32, len(req.Prompts))
		for i, p := range req.Prompts {
			out[i] = m.EncodeText(p, add)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: API %q", ErrContent, req.API)
}

// Health returns every configured model's tokenization state, sorted by model name.
func (s *Service) Health() []ModelHealth {
	out := make([]ModelHealth, 0, len(s.names))
	for _, name := range s.names {
		st := s.models[name]
		mh := ModelHealth{Model: name, Tokenizer: st.cfg.Tokenizer, Chat: "ok"}
		if st.model != nil {
			mh.Class = st.model.Class
			mh.Tokenizer = st.model.Dir
			mh.Cache = st.model.CacheStats()
			mh.Render = st.model.RenderCacheStats()
			if err := st.model.ChatError(); err != nil {
				mh.Chat = err.Error()
			}
		} else {
			mh.Chat = "no local tokenizer"
		}
		st.mu.Lock()
		for _, p := range st.paths {
			mh.Paths = append(mh.Paths, *st.health[p])
		}
		st.mu.Unlock()
		s.smu.Lock()
		mh.Shadow = st.shadow.h
		s.smu.Unlock()
		out = append(out, mh)
	}
	return out
}

// RemoteWorkerHealth is one worker's remote tokenization record, as /debug/tokenize
// shows it: workers that failed lately (a worker with nothing to report is absent).
type RemoteWorkerHealth struct {
	Address string `json:"address"`
	// Streak is the count of consecutive failures (timeout, connection, 5xx, bad
	// answer); at 3 the worker is skipped until SkipUntil.
	Streak    int       `json:"failure_streak"`
	SkipUntil time.Time `json:"skipped_until,omitzero"`
	Skipped   bool      `json:"skipped"`
}

// RemoteWorkers returns the workers with a remote failure record, sorted by address.
func (s *Service) RemoteWorkers() []RemoteWorkerHealth {
	now := s.now()
	s.wmu.Lock()
	out := make([]RemoteWorkerHealth, 0, len(s.workers))
	for addr, w := range s.workers {
		if w.streak == 0 && !now.Before(w.skipUntil) {
			continue
		}
		out = append(out, RemoteWorkerHealth{Address: addr, Streak: w.streak, SkipUntil: w.skipUntil,
			Skipped: s.backoff > 0 && now.Before(w.skipUntil)})
	}
	s.wmu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}
