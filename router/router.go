// Package router is kvroute's core: Pick turns a parsed request into a booked Ticket
// for one worker; the Ticket's FirstToken, Done and Abort release the booking and hand
// what was observed to scoring for learning. The router owns the in-flight state.
//
// It knows nothing of Envoy or HTTP: the ext_proc server and the plain proxy are two
// fronts over the same Router.
package router

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/workers"
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
	// KVBytesPerToken is the model's KV cache per token, bytes: 2 (K and V) × layers ×
	// KV heads × head dim × KV dtype bytes (vllm/v1/kv_cache_interface.py
	// FullAttentionSpec.page_size_bytes ÷ block_size); 0 → scoring's default
	// (scoring.kv_bytes_per_token). It prices a disaggregated pair's KV transfer.
	KVBytesPerToken float64
}

// DefaultMaxPromptTokens caps the prompt tokens considered for routing of a model
// whose context length is unknown: 131,072 tokens (128 Ki, the longest context of the
// common open models), 8,192 blocks at block size 16.
const DefaultMaxPromptTokens = 131072

// Router defaults for zero Options fields (config.Default takes its router section
// from them, so each is written once, here).
const (
	DefaultBlockSize = kvindex.DefaultBlockSize // tokens per KV block (vLLM --block-size)
	DefaultTicketTTL = 10 * time.Minute         // see Options.TicketTTL
)

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

// Error is a refusal with the HTTP status a front should answer with. Any part of
// kvroute that refuses a request returns one and lets front.ErrorReply render it in the
// request's API shape (OpenAI or Anthropic). The router itself speaks no HTTP: the
// status is a number it hands on (StatusNotFound and the others below).
type Error struct {
	Status     int    // 404 unknown model, 503 no healthy worker, 429 shed; any 4xx/5xx
	Type       string // OpenAI error type; "" → by status (front.ErrorReply)
	Message    string
	RetryAfter time.Duration // for 429 (and 503); 0 → front.ErrorReply's 1 s
	// Details is the machine-readable cause for logs and Envoy's
	// %RESPONSE_CODE_DETAILS% (no spaces); "" → by status (front.ErrorReply).
	Details string
	// Header are extra response headers (lower-case names), e.g. admission's
	// x-ratelimit-* on a 429; front.ErrorReply appends them after its own.
	Header [][2]string
}

func (e *Error) Error() string { return e.Message }

// The statuses the router's own refusals carry (RFC 9110 §15).
const (
	StatusNotFound           = 404 // unknown model
	StatusTooManyRequests    = 429 // shed
	StatusServiceUnavailable = 503 // no healthy worker
)

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
	sloMargin  sloMargins // calibration of the SLO refusal rule (slomargin.go)
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
		opt.DefaultBlockSize = DefaultBlockSize
	}
	if opt.TicketTTL <= 0 {
		opt.TicketTTL = DefaultTicketTTL
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

// MaxPromptIDs is the longest token-id prompt a request may carry: the longest
// Model.MaxModelLen, or Options.MaxPromptTokens when larger (vLLM rejects a prompt
// past its model's context length). The fronts bound the body's arrays by it while
// parsing (request.ParseBounded), so a longer one is refused before it is built.
func (r *Router) MaxPromptIDs() int {
	n := r.opt.MaxPromptTokens
	for _, md := range r.models {
		n = max(n, md.MaxModelLen)
	}
	return n
}
