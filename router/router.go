// Package router is kvroute's core: Pick turns a parsed request into a booked Ticket
// for one worker; the Ticket's FirstToken, Done and Abort release the booking and hand
// what was observed to scoring for learning. The router owns the in-flight state.
//
// It knows nothing of Envoy or HTTP: the ext_proc server and the plain proxy are two
// fronts over the same Router.
package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tracing"
	"github.com/kvroute/kvroute/workers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Model is what the router needs to know about one served model.
type Model struct {
	Name      string // served model name as clients send it
	BlockSize int    // KV block size in tokens (vLLM --block-size, default 16)
	// Base is the base model for a LoRA adapter name; "" when Name is a base model.
	// Block keys of an adapter live in the namespace (Base, Name).
	Base string
	// MaxModelLen is the model's context length in tokens (vLLM --max-model-len); 0
	// unknown. It caps the prompt tokens considered for routing (Options.MaxPromptTokens).
	MaxModelLen int
}

// DefaultMaxPromptTokens caps the prompt tokens considered for routing of a model
// whose context length is unknown: 131,072 tokens (128 Ki, the longest context of the
// common open models), 8,192 blocks at block size 16.
const DefaultMaxPromptTokens = 131072

// PrefixIndex is the part of the KV index the router uses. *kvindex.Index implements it.
type PrefixIndex interface {
	// Lookup appends each worker's cached leading prefix for keys to dst.
	Lookup(keys []kvindex.Key, dst []kvindex.Match) []kvindex.Match
	// Book books keys on worker until events confirm them or they expire, and returns
	// what it added; Withdraw takes that back (the request failed before the worker
	// computed the blocks).
	Book(worker string, keys []kvindex.Key) kvindex.Booking
	Withdraw(b kvindex.Booking) int
	// RemoveWorker forgets every block of worker.
	RemoveWorker(worker string)
}

// Options configures a Router. Zero values take the defaults documented per field.
type Options struct {
	Registry  *workers.Registry  // required
	Index     PrefixIndex        // nil: no prefix information (load-only picks)
	Tokenizer tokenize.Tokenizer // nil: tokenize.GivenOnly
	Policy    scoring.Policy     // nil: &scoring.Simple{}
	Models    []Model            // served models; a request for a model no worker serves gets 404
	// DefaultBlockSize is used for models not listed in Models. 0 means 16 (vLLM's default).
	DefaultBlockSize int
	// TicketTTL releases tickets still open after this long (lost responses). 0 means 10 minutes.
	TicketTTL time.Duration
	// MaxPromptTokens caps the prompt tokens that are hashed, looked up and booked as
	// speculative index entries per request, for models without Model.MaxModelLen (a
	// model's own context length caps its requests: vLLM rejects longer prompts). The
	// prediction still sees the whole prompt length. 0 means DefaultMaxPromptTokens.
	MaxPromptTokens int
	Metrics         *metrics.Set     // nil: an unregistered set
	Now             func() time.Time // nil: time.Now
	// Tracer starts the kvroute.tokenize, kvroute.index_lookup and kvroute.pick child
	// spans under the span in Pick's context (package tracing); nil: none.
	Tracer trace.Tracer
	// Saturation is the engines' own capacity, the only grounds on which
	// PickOptions.Wait holds a request back. Zero fields take Saturation's defaults.
	Saturation Saturation
}

// Saturation says when a worker's engine can take no more work at its next step, in
// the engine's own terms (vLLM v1's scheduler, vllm/v1/core/sched/scheduler.py: each
// step schedules the running requests' decode tokens first, then admits waiting
// requests while len(running) < max_num_seqs and the step's token budget
// max_num_batched_tokens lasts, chunking prefills into what is left). A worker is
// saturated when kvroute's bookings on it (its own and its peers') fill either limit:
//
//	Booked.PrefillTokens + Booked.Decoding ≥ BatchTokens   (one token per decoding sequence)
//	Booked.Requests ≥ max_num_seqs   (the worker's Profile.MaxNumSeqs, else MaxNumSeqs)
//
// Below both, a request sent now is scheduled at the worker's next step, so holding it
// in kvroute's queue would leave capacity idle; at either, it would wait in the
// engine's FCFS queue, so it waits in kvroute's instead (PickOptions.Wait). Token-less bookings (Booked.Unsized)
// count against MaxNumSeqs only; scraped load is not used (it is as old as the scrape,
// and a scrape wakes no queue).
type Saturation struct {
	BatchTokens int // vLLM --max-num-batched-tokens; 0 → scoring.DefaultBatchTokens
	// MaxNumSeqs is vLLM's --max-num-seqs of a worker whose workers.Profile.MaxNumSeqs
	// is 0; 0 → DefaultMaxNumSeqs.
	MaxNumSeqs int
}

// DefaultMaxNumSeqs is vLLM's default --max-num-seqs for the OpenAI server on GPUs
// under 70 GiB and on A100s: 256 (vllm/engine/arg_utils.py,
// EngineArgs.get_batch_defaults; 1024 on larger GPUs — configure
// workers[].profile.max_num_seqs there).
const DefaultMaxNumSeqs = 256

// Saturated reports whether b fills s (the type's doc) on a worker without a
// max_num_seqs of its own.
func (s Saturation) Saturated(b scoring.Booked) bool { return s.SaturatedOn(nil, b) }

// SaturatedOn reports whether b fills s on w: w.Profile.MaxNumSeqs when set (w may be
// nil), else s.MaxNumSeqs, else DefaultMaxNumSeqs.
func (s Saturation) SaturatedOn(w *workers.Worker, b scoring.Booked) bool {
	bt, ns := s.BatchTokens, s.MaxNumSeqs
	if bt <= 0 {
		bt = scoring.DefaultBatchTokens
	}
	if w != nil && w.Profile.MaxNumSeqs > 0 {
		ns = w.Profile.MaxNumSeqs
	}
	if ns <= 0 {
		ns = DefaultMaxNumSeqs
	}
	return b.PrefillTokens+b.Decoding >= bt || b.Requests >= ns
}

// Error is a refusal with the HTTP status a front should answer with. Any part of
// kvroute that refuses a request returns one and lets ErrorReply render it in the
// request's API shape (OpenAI or Anthropic).
type Error struct {
	Status     int    // 404 unknown model, 503 no healthy worker, 429 shed; any 4xx/5xx
	Type       string // OpenAI error type; "" → by status (ErrorReply)
	Message    string
	RetryAfter time.Duration // for 429 (and 503); 0 → ErrorReply's 1 s
	// Details is the machine-readable cause for logs and Envoy's
	// %RESPONSE_CODE_DETAILS% (no spaces); "" → by status (ErrorReply).
	Details string
	// Header are extra response headers (lower-case names), e.g. admission's
	// x-ratelimit-* on a 429; ErrorReply appends them after its own.
	Header [][2]string
}

func (e *Error) Error() string { return e.Message }

// Router decides and books. Safe for concurrent use.
type Router struct {
	opt    Options
	models map[string]Model
	m      *metrics.Router
	seq    atomic.Uint64

	// mu guards flights, tickets and every Ticket's state; under it run only the
	// O(workers) part of a pick (Policy.Pick after Preparer.Prepare, the booking).
	// Tokenizing, hashing, the index lookup, predictions and speculative index entries
	// (O(prompt)) run outside it.
	mu      sync.Mutex
	flights map[string]*flight // worker name → bookings
	tickets map[uint64]*Ticket // open tickets
	pub     sync.Map           // worker name → *flight, for reads without mu

	// specMu orders speculative bookings (read side, outside mu) before a removed
	// worker's index cleanup (write side): a booking either lands before the cleanup or
	// sees its ticket released and books nothing.
	specMu sync.RWMutex

	// peerBooked is the bookings peer replicas hold per worker (SetPeerBookings);
	// changes counts changes of this replica's own bookings (Changes).
	peerBooked atomic.Pointer[map[string]PeerWorker]
	changes    atomic.Uint64
	changed    chan struct{} // cap 1: signalled at each change (ChangeSignal)

	// onCapacity is called (outside mu) after a booking shrank: a ticket ended or its
	// first token arrived (OnCapacity).
	onCapacity atomic.Pointer[func()]
}

// OnCapacity sets fn to be called, outside the router's lock and from the goroutine
// that freed it, each time a booking shrinks: a ticket ends (Done, Complete, Abort,
// the sweep, its worker removed) or its first token arrives (its prefill is done).
// admission's queue dispatches on it instead of polling. nil removes it.
func (r *Router) OnCapacity(fn func()) {
	if fn == nil {
		r.onCapacity.Store(nil)
		return
	}
	r.onCapacity.Store(&fn)
}

func (r *Router) capacityFreed() {
	if fn := r.onCapacity.Load(); fn != nil {
		(*fn)()
	}
}

// ErrWait is Pick's answer under PickOptions.Wait when the request should wait in
// kvroute's queue: the worker the policy would pick is saturated
// (Options.Saturation). Nothing was booked.
var ErrWait = errors.New("router: the worker the request would be sent to is saturated")

// flight is one worker's bookings. booked is guarded by Router.mu; pub is booked as
// last published (atomics: a lock-free snapshot for Prepare, possibly stale or torn,
// which Pick corrects under mu).
type flight struct {
	booked             scoring.Booked
	left               leftEvents // when this replica's requests here left the queue / finished
	pub                [4]atomic.Int64
	inFlight, inTokens prometheus.Gauge
}

func (f *flight) snapshot() scoring.Booked {
	return scoring.Booked{Requests: int(f.pub[0].Load()), PrefillTokens: int(f.pub[1].Load()),
		Prefilling: int(f.pub[2].Load()), Decoding: int(f.pub[3].Load())}
}

// New returns a Router and subscribes it to the registry so that a removed worker's
// in-flight state and index entries are released.
func New(opt Options) *Router {
	if opt.Tokenizer == nil {
		opt.Tokenizer = tokenize.GivenOnly{}
	}
	if opt.Policy == nil {
		opt.Policy = &scoring.Simple{}
	}
	if opt.DefaultBlockSize <= 0 {
		opt.DefaultBlockSize = 16
	}
	if opt.TicketTTL <= 0 {
		opt.TicketTTL = 10 * time.Minute
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.MaxPromptTokens <= 0 {
		opt.MaxPromptTokens = DefaultMaxPromptTokens
	}
	r := &Router{opt: opt, changed: make(chan struct{}, 1), models: map[string]Model{}, m: opt.Metrics.Router,
		flights: map[string]*flight{}, tickets: map[uint64]*Ticket{}}
	for _, md := range opt.Models {
		if md.BlockSize <= 0 {
			md.BlockSize = opt.DefaultBlockSize
		}
		r.models[md.Name] = md
	}
	opt.Registry.Subscribe(registryListener{r})
	return r
}

// Registry returns the worker registry the router picks from (fronts use it for
// passive health: a worker that refuses connections is marked unhealthy).
func (r *Router) Registry() *workers.Registry { return r.opt.Registry }

// Policy returns the scoring policy in use.
func (r *Router) Policy() scoring.Policy { return r.opt.Policy }

// PickOptions are per-request inputs that do not come from the body.
type PickOptions struct {
	RequestID string        // for logs and the admin view; "" → generated
	SLO       time.Duration // TTFT objective from x-slo-ttft-ms; 0 none
	// Exclude names a worker not to pick (a retry after that worker refused the
	// connection); "" none.
	Exclude string
	// Subset, when SubsetHint is set, restricts the pick to the workers whose "ip:port"
	// address is listed: the Gateway API Inference Extension endpoint subset hint
	// (docs/proposals/004-endpoint-picker-protocol, "Endpoint Subset"). An empty or
	// fully ineligible list is a 503.
	Subset     []string
	SubsetHint bool
	// Fallbacks is how many next-best workers Ticket.Fallbacks lists after the pick, in
	// order of preference (the protocol's "ip:port,ip:port,..." destination list for
	// gateways that retry down it); 0 none.
	Fallbacks int
	// Classify, when set, is called once per Pick with the prompt tokens the router
	// counted (0 unknown), before the decision; it returns the SLO to pick with
	// (replacing SLO) and whether the request may wait (Wait). Admission's QoS classes
	// use it: a class can match on prompt length.
	Classify func(promptTokens int) (slo time.Duration, wait bool)
	// Wait (with SLO > 0) makes Pick answer ErrWait, booking nothing, when the
	// worker the policy would pick is saturated (Options.Saturation): its engine would
	// not schedule the request at its next step, so sending it there only queues it
	// in the engine's FCFS queue, where kvroute's priority and fairness no longer
	// apply; it waits in kvroute's queue instead and is picked again when capacity
	// frees (late binding). A pick onto a worker below saturation goes ahead whatever
	// its predicted TTFT — waiting makes it no faster and leaves the step under-filled
	// — and the choice among workers stays the policy's (its cache affinity and load
	// balance: the queue changes when a request is sent, not where). The answer
	// depends on the request (its cached prefix decides the policy's choice), so
	// the queue tries entries behind one told to wait (FairQueue.Drain). The policy
	// decides as a dry run first (scoring.Input.DryRun) when any candidate is
	// saturated; only a pick that goes ahead changes its state.
	Wait bool
}

// Pick chooses a worker for req and books it. The returned Ticket must be ended with
// Done or Abort (FirstToken first, when observed); an unended ticket is released by the
// sweep after TicketTTL. Errors are *Error.
func (r *Router) Pick(ctx context.Context, req *request.Request, opt PickOptions) (*Ticket, error) {
	in, cands, err := r.prepare(ctx, req, opt)
	if err != nil {
		return nil, err
	}
	_, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanPick)
	defer span.End()
	start := time.Now()
	r.prepolicy(in, cands)
	r.mu.Lock()
	// prepare ran without r.mu: a worker may have left the registry since. Its removal
	// listener needs r.mu, so a worker still registered now is cleaned up after this
	// booking, and one already gone must not be booked (it would re-create its flight,
	// gauges and speculative index entries after the cleanup).
	if r.opt.Registry.Version() != in.regVersion {
		cands = r.liveLocked(cands)
	}
	if len(cands) == 0 {
		r.mu.Unlock()
		return nil, r.noHealthy(req.Model)
	}
	for i := range cands {
		r.bookedLocked(&cands[i], in.Now, in.BlockSize)
	}
	if (opt.Wait || in.wait) && in.SLO > 0 && r.waitLocked(in, cands) {
		r.mu.Unlock()
		return nil, ErrWait
	}
	d := r.opt.Policy.Pick(&in.Input, cands)
	if d.Shed || d.Index < 0 || d.Index >= len(cands) {
		r.mu.Unlock()
		r.m.Errors.WithLabelValues("shed").Inc()
		ra := d.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		return nil, &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", RetryAfter: ra,
			Message: "all workers are predicted to miss the TTFT limit; retry later"}
	}
	c := cands[d.Index]
	t := &Ticket{
		r: r, id: r.seq.Add(1), RequestID: opt.RequestID, Worker: c.Worker.Name, Address: c.Worker.Address,
		Model: in.Model, PromptTokens: in.PromptTokens, CachedTokens: c.CachedTokens, Reason: d.Reason,
		Path: in.path, Degraded: in.Degraded, Start: in.Now, booked: c.Booked, load: c.Load,
	}
	if d.Predictions != nil {
		t.Predicted = d.Predictions[d.Index]
	}
	if opt.Fallbacks > 0 {
		t.Fallbacks = fallbacks(cands, d, opt.Fallbacks)
	}
	t.prefill = max(in.PromptTokens-c.CachedTokens, 0)
	if t.RequestID == "" {
		t.RequestID = fmt.Sprintf("kvr-%d", t.id)
	}
	t.on, t.onAddress = t.Worker, t.Address
	r.tickets[t.id] = t
	t.bookLocked(r.flightLocked(t.Worker), 1)
	r.mu.Unlock()
	r.book(t, in.Keys)
	r.m.DecisionSeconds.Observe(time.Since(start).Seconds())
	r.m.Decisions.WithLabelValues(t.Worker, d.Reason).Inc()
	if sh, ok := r.opt.Tokenizer.(tokenize.Shadower); ok && in.path == tokenize.PathLocal {
		sh.Shadow(req, in.path, in.Tokens, t.Address) // sampled; checked off the request path
	}
	if in.PromptTokens > 0 {
		r.m.PromptTokens.Observe(float64(in.PromptTokens))
		r.m.PromptTokensSeen.Add(float64(in.PromptTokens))
		r.m.CachedTokens.Observe(float64(t.CachedTokens))
		r.m.PrefixHitTokens.Add(float64(t.CachedTokens))
	}
	return t, nil
}

// waitLocked reports whether the request should wait (PickOptions.Wait): the
// worker the policy would pick (a dry run, scoring.Input.DryRun) is saturated. No
// candidate saturated: no dry run. Caller holds r.mu.
func (r *Router) waitLocked(in *input, cands []scoring.Candidate) bool {
	if !slices.ContainsFunc(cands, func(c scoring.Candidate) bool { return r.opt.Saturation.SaturatedOn(c.Worker, c.Booked) }) {
		return false
	}
	in.DryRun = true
	d := r.opt.Policy.Pick(&in.Input, cands)
	in.DryRun = false
	if d.Shed || d.Index < 0 || d.Index >= len(cands) {
		return false // the pick refuses it: let Pick answer so
	}
	return r.opt.Saturation.SaturatedOn(cands[d.Index].Worker, cands[d.Index].Booked)
}

// Explanation is one worker's view of a request without booking anything.
type Explanation struct {
	Input      *scoring.Input
	Candidates []scoring.Candidate
	Decision   scoring.Decision
	Path       tokenize.Path
}

// Explain computes what Pick would decide for req, without booking, speculating or
// changing policy state: it sets scoring.Input.DryRun, under which every policy decides
// as usual but does not advance round robin, update Dynamo's running mean, insert into
// GIE's LRU or SGLang's radix tree, log its decision or count metrics (scoring.go,
// baselines.go, dynamo.go, gie.go, sglang.go, kvroute.go). The one thing a dry run
// shares with a real pick is the injected random source: policies that draw from it
// (random, tie-breaks, Dynamo's temperature) consume draws, which shifts no
// distribution. Errors are *Error, as for Pick.
func (r *Router) Explain(ctx context.Context, req *request.Request, opt PickOptions) (*Explanation, error) {
	in, cands, err := r.prepare(ctx, req, opt)
	if err != nil {
		return nil, err
	}
	in.DryRun = true // policies decide as usual but change no state and count nothing
	r.prepolicy(in, cands)
	r.mu.Lock()
	defer r.mu.Unlock()
	if cands = r.liveLocked(cands); len(cands) == 0 {
		return nil, r.noHealthy(req.Model)
	}
	for i := range cands {
		r.bookedLocked(&cands[i], in.Now, in.BlockSize)
	}
	d := r.opt.Policy.Pick(&in.Input, cands)
	return &Explanation{Input: &in.Input, Candidates: cands, Decision: d, Path: in.path}, nil
}

type input struct {
	scoring.Input
	path       tokenize.Path
	regVersion uint64 // the registry version the candidates were read at
	wait       bool   // PickOptions.Classify allowed waiting
}

// prepare does the lock-free part of a pick: candidates, tokenization, block keys,
// index lookup, scraped load.
func (r *Router) prepare(ctx context.Context, req *request.Request, opt PickOptions) (*input, []scoring.Candidate, error) {
	ws, known, version := r.opt.Registry.CandidatesAt(req.Model, nil)
	if !known {
		if req.Model == "" {
			r.m.Errors.WithLabelValues("no_worker").Inc()
			return nil, nil, &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Message: "no workers are configured"}
		}
		r.m.Errors.WithLabelValues("unknown_model").Inc()
		return nil, nil, &Error{Status: http.StatusNotFound, Type: "NotFoundError",
			Message: fmt.Sprintf("The model `%s` does not exist.", echoModel(req.Model))}
	}
	if opt.Exclude != "" {
		ws = slices.DeleteFunc(ws, func(w *workers.Worker) bool { return w.Name == opt.Exclude })
	}
	if opt.SubsetHint {
		ws = slices.DeleteFunc(ws, func(w *workers.Worker) bool { return !slices.Contains(opt.Subset, w.Address) })
		if len(ws) == 0 {
			r.m.Errors.WithLabelValues("subset").Inc()
			return nil, nil, &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable",
				Message: fmt.Sprintf("no healthy worker for model %q among the gateway's endpoint subset", echoModel(req.Model))}
		}
	}
	if len(ws) == 0 {
		return nil, nil, r.noHealthy(req.Model)
	}
	md, ok := r.models[req.Model]
	if !ok {
		md = Model{Name: req.Model, BlockSize: r.opt.DefaultBlockSize}
	}
	in := &input{regVersion: version, Input: scoring.Input{RequestID: opt.RequestID, Request: req, Model: req.Model,
		BlockSize: md.BlockSize, MaxTokens: req.MaxTokens, SLO: opt.SLO, Now: r.opt.Now()}}
	if req.API == request.APIOther {
		in.Degraded, in.path = "not_inference", tokenize.PathNone
	} else {
		tctx, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanTokenize)
		res, err := r.opt.Tokenizer.Tokenize(tctx, req)
		span.SetAttributes(tracing.TokenizePath.String(string(res.Path)), attribute.Int("gen_ai.usage.input_tokens", res.PromptTokens))
		span.End()
		switch {
		case err != nil:
			in.Degraded, in.path = "tokenize_failed", tokenize.PathNone
		case res.Path == tokenize.PathNone:
			in.Degraded, in.path = res.Degraded, tokenize.PathNone
			if in.Degraded == "" {
				in.Degraded = "no_tokens"
			}
		default:
			in.path, in.Tokens, in.PromptTokens = res.Path, res.Tokens, res.PromptTokens
		}
	}
	if opt.Classify != nil {
		in.SLO, in.wait = opt.Classify(in.PromptTokens)
	}
	if limit := r.maxPromptTokens(md); len(in.Tokens) > limit {
		// Routing considers the first limit tokens: what is hashed, looked up and booked
		// is bounded per request; the prediction still sees the whole prompt length.
		in.Tokens = in.Tokens[:limit]
		r.m.PromptsCapped.Inc()
	}
	if len(in.Tokens) > 0 {
		ns := kvindex.Namespace{Model: req.Model, CacheSalt: req.CacheSalt}
		if md.Base != "" {
			ns.Model, ns.LoRA = md.Base, md.Name
		}
		in.Keys = kvindex.HashBlocks(ns.Seed(), in.Tokens, md.BlockSize, make([]kvindex.Key, 0, len(in.Tokens)/md.BlockSize))
	}
	cands := make([]scoring.Candidate, len(ws))
	loads := r.opt.Registry.Loads(ws, make([]workers.Load, 0, len(ws)))
	for i, w := range ws {
		cands[i] = scoring.Candidate{Worker: w, Load: loads[i]}
	}
	if r.opt.Index != nil && len(in.Keys) > 0 {
		_, span := tracing.Start(ctx, r.opt.Tracer, tracing.SpanIndexLookup)
		defer span.End()
		span.SetAttributes(attribute.Int("kvroute.blocks", len(in.Keys)))
		for _, m := range r.opt.Index.Lookup(in.Keys, nil) {
			// ws is sorted by name (Registry.Candidates): a binary search per match, no map.
			if i, ok := slices.BinarySearchFunc(ws, m.Worker, func(w *workers.Worker, name string) int {
				return strings.Compare(w.Name, name)
			}); ok {
				cands[i].Cached = m
				// vLLM's hit is block-aligned and never the whole prompt: at most
				// ⌊(prompt−1)/block_size⌋ blocks (vllm/v1/core/kv_cache_manager.py
				// get_computed_blocks recomputes the last token).
				cands[i].CachedTokens = min(m.Blocks, max(in.PromptTokens-1, 0)/md.BlockSize) * md.BlockSize
			}
		}
	}
	return in, cands, nil
}

// noHealthy counts and returns the 503 for a model with no healthy worker.
func (r *Router) noHealthy(model string) *Error {
	r.m.Errors.WithLabelValues("no_worker").Inc()
	return &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable",
		Message: fmt.Sprintf("no healthy worker serves model %q", model)}
}

// liveLocked drops, in place, the candidates whose worker is no longer the one
// registered under its name (removed, or replaced with a changed one). Caller holds r.mu.
func (r *Router) liveLocked(cands []scoring.Candidate) []scoring.Candidate {
	out := cands[:0]
	for _, c := range cands {
		if w, ok := r.opt.Registry.Get(c.Worker.Name); ok && w == c.Worker {
			out = append(out, c)
		}
	}
	return out
}

// flightLocked returns worker's in-flight state, created (with its gauges) on first
// use. Caller holds r.mu.
func (r *Router) flightLocked(worker string) *flight {
	f := r.flights[worker]
	if f == nil {
		f = &flight{inFlight: r.m.InFlight.WithLabelValues(worker), inTokens: r.m.InFlightTokens.WithLabelValues(worker)}
		r.flights[worker] = f
		r.pub.Store(worker, f)
	}
	return f
}

// bookLocked adds (sign 1) or removes (sign -1) t's share of f's bookings as t stands
// now: a request prefilling its uncached tokens before the first token, decoding after.
// Caller holds r.mu; f belongs to t.on.
func (t *Ticket) bookLocked(f *flight, sign int) {
	f.booked.Requests += sign
	if t.firstAt.IsZero() {
		f.booked.Prefilling += sign
		f.booked.PrefillTokens += sign * t.prefill
		if t.PromptTokens <= 0 {
			f.booked.Unsized += sign
		}
	} else {
		f.booked.Decoding += sign
	}
	t.r.gaugesLocked(t.on, f)
}

// gaugesLocked publishes f's bookings (gauges and the lock-free snapshot) after a
// change. Caller holds r.mu.
func (r *Router) gaugesLocked(_ string, f *flight) {
	b := &f.booked
	r.noteChange()
	f.pub[0].Store(int64(b.Requests))
	f.pub[1].Store(int64(b.PrefillTokens))
	f.pub[2].Store(int64(b.Prefilling))
	f.pub[3].Store(int64(b.Decoding))
	f.inFlight.Set(float64(b.Requests))
	f.inTokens.Set(float64(b.PrefillTokens))
}

// maxPromptTokens is the number of prompt tokens routing considers for model md.
func (r *Router) maxPromptTokens(md Model) int {
	if md.MaxModelLen > 0 {
		return md.MaxModelLen
	}
	return r.opt.MaxPromptTokens
}

// prepolicy gives each candidate its bookings as last published and lets a Preparer
// policy do its per-candidate work, both without r.mu; Pick and Explain then redo,
// under r.mu, only what the bookings made since invalidate.
func (r *Router) prepolicy(in *input, cands []scoring.Candidate) {
	sp, ok := r.opt.Policy.(scoring.Preparer)
	if !ok {
		return
	}
	peers, hl := r.peerBooked.Load(), r.writeHalfLife()
	for i := range cands {
		var b scoring.Booked
		if v, ok := r.pub.Load(cands[i].Worker.Name); ok {
			b = v.(*flight).snapshot()
		}
		cands[i].Booked = b
		addPeer(&cands[i], peers, in.Now, hl, in.BlockSize)
	}
	sp.Prepare(&in.Input, cands)
}

// book adds t's speculative index entries, outside r.mu (O(prompt blocks)). A ticket
// already released (its worker removed meanwhile) books nothing: specMu makes the
// removal's index cleanup wait for a booking in progress.
func (r *Router) book(t *Ticket, keys []kvindex.Key) {
	if r.opt.Index == nil || len(keys) == 0 {
		return
	}
	r.specMu.RLock()
	defer r.specMu.RUnlock()
	if t.released.Load() {
		return
	}
	b := r.opt.Index.Book(t.Worker, keys)
	if b.Len() > 0 {
		t.spec.Store(&b)
		r.noteChange() // the keys being prefilled changed (LocalBookings)
	}
}

// withdraw removes t's speculative index entries (the request failed before the worker
// computed its blocks).
func (r *Router) withdraw(t *Ticket) {
	if b := t.spec.Swap(nil); b != nil && r.opt.Index != nil {
		r.m.SpecWithdrawn.Add(float64(r.opt.Index.Withdraw(*b)))
	}
}

// Sweep releases tickets older than TicketTTL and returns how many it released.
func (r *Router) Sweep() int {
	now := r.opt.Now()
	var expired []*Ticket
	r.mu.Lock()
	for _, t := range r.tickets {
		if now.Sub(t.Start) > r.opt.TicketTTL {
			expired = append(expired, t)
		}
	}
	for _, t := range expired {
		r.releaseLocked(t, response.OutcomeExpired)
	}
	r.mu.Unlock()
	if n := len(expired); n > 0 {
		r.m.TicketsReleased.WithLabelValues("expired").Add(float64(n))
		r.capacityFreed()
	}
	return len(expired)
}

// Run sweeps expired tickets every TicketTTL/4 (at least every second, at most every
// minute) until ctx is cancelled.
func (r *Router) Run(ctx context.Context) {
	every := min(max(r.opt.TicketTTL/4, time.Second), time.Minute)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			r.Sweep()
		}
	}
}

// WorkerState is the admin view of one worker.
type WorkerState struct {
	Name    string         `json:"name"`
	Address string         `json:"address"`
	Models  []string       `json:"models"`
	Healthy bool           `json:"healthy"`
	Booked  scoring.Booked `json:"booked"`
	Load    workers.Load   `json:"load"`
}

// TicketState is the admin view of one in-flight request.
type TicketState struct {
	RequestID     string        `json:"request_id"`
	Worker        string        `json:"worker"`
	Model         string        `json:"model"`
	PromptTokens  int           `json:"prompt_tokens"`
	CachedTokens  int           `json:"cached_tokens"`
	FirstToken    bool          `json:"first_token"`
	Age           time.Duration `json:"age_ns"`
	PredictedTTFT time.Duration `json:"predicted_ttft_ns"`
}

// Snapshot returns the workers with their bookings and the open tickets, oldest first.
func (r *Router) Snapshot() ([]WorkerState, []TicketState) {
	now := r.opt.Now()
	ws := r.opt.Registry.All()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerState, 0, len(ws))
	for _, w := range ws {
		s := WorkerState{Name: w.Name, Address: w.Address, Models: w.Models, Healthy: r.opt.Registry.Healthy(w.Name), Load: r.opt.Registry.Load(w.Name)}
		if f := r.flights[w.Name]; f != nil {
			s.Booked = f.booked
		}
		out = append(out, s)
	}
	ts := make([]TicketState, 0, len(r.tickets))
	for _, t := range r.tickets {
		ts = append(ts, TicketState{RequestID: t.RequestID, Worker: t.on, Model: t.Model, PromptTokens: t.PromptTokens,
			CachedTokens: t.CachedTokens, FirstToken: t.firstAt != (time.Time{}), Age: now.Sub(t.Start), PredictedTTFT: t.Predicted.TTFT})
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Age > ts[j].Age })
	return out, ts
}

// InFlight returns the number of open tickets (all workers).
func (r *Router) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tickets)
}

type registryListener struct{ r *Router }

func (l registryListener) WorkerAdded(*workers.Worker) {}

func (l registryListener) WorkerRemoved(w *workers.Worker) {
	r := l.r
	n := 0
	r.mu.Lock()
	for _, t := range r.tickets {
		if t.on == w.Name {
			r.releaseLocked(t, response.OutcomeAborted)
			n++
		}
	}
	delete(r.flights, w.Name)
	r.pub.Delete(w.Name)
	r.m.InFlight.DeleteLabelValues(w.Name)
	r.m.InFlightTokens.DeleteLabelValues(w.Name)
	r.mu.Unlock()
	if n > 0 {
		r.capacityFreed()
		r.m.TicketsReleased.WithLabelValues("worker_removed").Add(float64(n))
	}
	if r.opt.Index != nil {
		r.specMu.Lock() // a booking in progress lands first; later ones see their ticket released
		r.opt.Index.RemoveWorker(w.Name)
		r.specMu.Unlock()
	}
}

// Ticket is one booked routing decision. Its exported fields are set at Pick and never
// change; FirstToken, Done and Abort are safe to call from any goroutine, in any order,
// any number of times: only the first Done/Abort counts, and FirstToken after either
// is ignored.
type Ticket struct {
	r  *Router
	id uint64

	RequestID    string
	Worker       string // worker name
	Address      string // "ip:port" to send the request to
	Model        string
	PromptTokens int // 0 when unknown
	CachedTokens int // predicted cached prefix on Worker, tokens
	Reason       string
	Path         tokenize.Path
	Degraded     string
	Predicted    scoring.Prediction
	Start        time.Time
	// Fallbacks are the addresses of the next-best workers after Address, best first
	// (PickOptions.Fallbacks of them at most); nil unless asked for.
	Fallbacks []string

	prefill int            // booked uncached prefill tokens
	booked  scoring.Booked // the worker's bookings before this one (learning feature)
	load    workers.Load

	// guarded by r.mu
	firstAt time.Time
	ended   bool
	outcome response.Outcome // set when ended (outcome.go)
	// on is the worker holding the booking: Worker, unless Served moved it (onAddress
	// its address; moved: the prediction was made for another worker).
	on, onAddress string
	moved         bool

	released atomic.Bool                     // ended (set under r.mu), read without it
	spec     atomic.Pointer[kvindex.Booking] // speculative entries booked for it; nil none
	onFirst  atomic.Pointer[func(ttft time.Duration)]
}

// OnFirstToken makes FirstToken call f with the observed TTFT (from Start to the first
// token), once, outside the router's lock, after its own metrics; a later call replaces
// f. The admission stage uses it for its per-tenant TTFT. Safe for concurrent use.
func (t *Ticket) OnFirstToken(f func(ttft time.Duration)) { t.onFirst.Store(&f) }

// FirstToken records that the first generated token reached kvroute at time at (zero
// → now): the prefill part of the booking is released and the observed TTFT is handed
// to the policy if it learns.
func (t *Ticket) FirstToken(at time.Time) {
	r := t.r
	if at.IsZero() {
		at = r.opt.Now()
	}
	r.mu.Lock()
	if t.ended || !t.firstAt.IsZero() {
		r.mu.Unlock()
		return
	}
	on, moved := t.on, t.moved
	f := r.flights[on]
	if f != nil {
		t.bookLocked(f, -1) // as prefilling
	}
	t.firstAt = at
	if f != nil {
		t.bookLocked(f, 1) // as decoding
		f.left.first.add(at)
	}
	r.mu.Unlock()
	ttft := at.Sub(t.Start)
	r.m.TicketsReleased.WithLabelValues("first_token").Inc()
	r.m.TTFTSeconds.WithLabelValues(on).Observe(ttft.Seconds())
	if l, ok := r.opt.Policy.(scoring.Learner); ok && !moved {
		l.Observe(t.observation(ttft, 0, response.Usage{}, 0))
	}
	if f := t.onFirst.Load(); f != nil {
		(*f)(ttft)
	}
	r.capacityFreed()
}

// Done records completion (end of stream, trailers, or a complete non-streamed body)
// at time at (zero → now) with the upstream status and the usage the engine reported,
// classified on the status alone (response.StatusOutcome). Fronts that track the body
// call Complete with the body's outcome instead.
func (t *Ticket) Done(status int, usage response.Usage, at time.Time) {
	t.Complete(response.Result{Status: status, Usage: usage, Outcome: response.StatusOutcome(status)}, at)
}

// Abort releases the booking without learning (client went away, upstream reset,
// stream cancelled): outcome aborted.
func (t *Ticket) Abort() {
	t.AbortWith(response.OutcomeAborted)
}

func (t *Ticket) firstAtLocked() time.Time {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.firstAt
}

// end ends t with outcome o and reports true, or reports false and the outcome t
// already ended with.
func (r *Router) end(t *Ticket, how string, o response.Outcome) (response.Outcome, bool) {
	r.mu.Lock()
	if t.ended {
		o = t.outcome
		r.mu.Unlock()
		return o, false
	}
	r.releaseLocked(t, o)
	r.mu.Unlock()
	r.m.TicketsReleased.WithLabelValues(how).Inc()
	r.capacityFreed()
	return o, true
}

// releaseLocked removes t's booking, recording outcome o. Caller holds r.mu and counts
// the release.
func (r *Router) releaseLocked(t *Ticket, o response.Outcome) {
	if t.ended {
		return
	}
	t.ended, t.outcome = true, o
	t.released.Store(true)
	delete(r.tickets, t.id)
	if f := r.flights[t.on]; f != nil {
		t.bookLocked(f, -1)
		// It has left the engine: the waiting queue if it ended before its first
		// token, the running set after.
		if now := r.opt.Now(); t.firstAt.IsZero() {
			f.left.first.add(now)
		} else {
			f.left.finished.add(now)
		}
	}
}

func (t *Ticket) observation(ttft, e2e time.Duration, u response.Usage, status int) scoring.Observation {
	return scoring.Observation{Worker: t.Worker, PromptTokens: t.PromptTokens, CachedTokens: t.CachedTokens,
		Booked: t.booked, Load: t.load, Predicted: t.Predicted, Start: t.Start, TTFT: ttft, E2E: e2e, Usage: u, Status: status}
}

// TraceAttributes describes the decision for the request's kvroute.route span (package
// tracing): the GenAI model and prompt size, the worker, its predicted cached tokens
// and TTFT (seconds), the reason and any degradation.
func (t *Ticket) TraceAttributes() []attribute.KeyValue {
	a := []attribute.KeyValue{tracing.Model(t.Model), tracing.Worker.String(t.Worker), tracing.Reason.String(t.Reason),
		tracing.CachedTokens.Int(t.CachedTokens), tracing.TokenizePath.String(string(t.Path))}
	if t.PromptTokens > 0 {
		a = append(a, tracing.Usage(t.PromptTokens, -1)...)
	}
	if t.Predicted.TTFT > 0 {
		a = append(a, tracing.PredictedTTFT.Float64(t.Predicted.TTFT.Seconds()))
	}
	if t.Degraded != "" {
		a = append(a, tracing.Degraded.String(t.Degraded))
	}
	return a
}

// servedLocked reads, under r.mu, the first-token time, the worker holding the
// booking and whether Served moved it.
func (t *Ticket) servedLocked() (time.Time, string, bool) {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	return t.firstAt, t.on, t.moved
}

// Served records the endpoint ("ip:port") the gateway reports as having served the
// request: the GIE protocol's x-gateway-destination-endpoint-served response metadata
// (docs/proposals/004-endpoint-picker-protocol, "Destination Endpoint Served"). When it
// differs from the pick — the gateway retried down the fallback list — the booking
// (prefill tokens, or the decoding slot after the first token) moves to the worker at
// that address, and the ticket no longer teaches the policy: its prediction was made
// for another worker. Speculative index entries stay where they were booked (they
// expire with their TTL). It returns true when the booking moved; an address no
// registered worker has, the address already booked, or an ended ticket change nothing.
func (t *Ticket) Served(address string) bool {
	r := t.r
	var to *workers.Worker
	for _, w := range r.opt.Registry.All() {
		if w.Address == address {
			to = w
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.ended || address == "" || address == t.onAddress {
		return false
	}
	if to == nil {
		r.m.ServedUnknown.Inc()
		return false
	}
	if f := r.flights[t.on]; f != nil {
		t.bookLocked(f, -1)
	}
	t.on, t.onAddress, t.moved = to.Name, to.Address, true
	t.bookLocked(r.flightLocked(to.Name), 1)
	r.m.ServedMoves.WithLabelValues(to.Name).Inc()
	return true
}

// fallbacks lists up to n candidates other than the chosen one, best first: by
// predicted TTFT when the policy predicts, else by fewest booked requests (name order
// breaks ties, as the candidates are sorted by name).
func fallbacks(cands []scoring.Candidate, d scoring.Decision, n int) []string {
	order := make([]int, 0, len(cands))
	for i := range cands {
		if i != d.Index {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if d.Predictions != nil && d.Predictions[i].TTFT != d.Predictions[j].TTFT {
			return d.Predictions[i].TTFT < d.Predictions[j].TTFT
		}
		return cands[i].Booked.Requests < cands[j].Booked.Requests
	})
	out := make([]string, 0, min(n, len(order)))
	for _, i := range order[:min(n, len(order))] {
		out = append(out, cands[i].Worker.Address)
	}
	return out
}
