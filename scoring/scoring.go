package scoring

import (
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/workers"
)

// Booked is kvroute's own in-flight view of one worker, kept by the router.
type Booked struct {
	Requests      int `json:"requests"`       // requests routed here and not yet finished
	PrefillTokens int `json:"prefill_tokens"` // uncached prompt tokens of booked requests without a first token yet
	Prefilling    int `json:"prefilling"`     // booked requests without a first token yet
	Decoding      int `json:"decoding"`       // booked requests past their first token, still generating
	Unsized       int `json:"unsized"`        // of Prefilling: booked without a known prompt size (token-less, degraded)
	// KVTokens is the KV footprint of the booked requests, tokens: each one's prompt
	// plus its requested output (max_tokens; 0 when unknown), on the worker that decodes
	// it and, until its prefill leg ends, on its prefill worker. Not exchanged with
	// peer replicas.
	KVTokens int `json:"kv_tokens"`
}

// AddShared adds o's Requests, PrefillTokens, Prefilling and Decoding to b: the counts
// replicas exchange (package peers). Unsized is not exchanged and stays b's own.
func (b *Booked) AddShared(o Booked) {
	b.Requests += o.Requests
	b.PrefillTokens += o.PrefillTokens
	b.Prefilling += o.Prefilling
	b.Decoding += o.Decoding
}

// Candidate is one worker that can serve the request, with everything known about it
// at pick time.
type Candidate struct {
	Worker *workers.Worker
	// Cached is the worker's cached leading prefix for this request (kvindex lookup).
	Cached kvindex.Match
	// CachedTokens = min(Cached.Blocks, ⌊(PromptTokens−1)/block size⌋) × block size: vLLM's
	// hit is block-aligned and never the whole prompt (the last token is recomputed).
	CachedTokens int
	Booked       Booked
	Load         workers.Load // the worker's own scraped view; zero ScrapedAt = unknown
	// PeerLeft counts peer replicas' requests on the worker that left its waiting queue
	// (first token) / running set (finished) after Load.ScrapedAt: the scrape still
	// counts them, but they are neither booked so (Booked) nor foreign. The policy
	// counts its own such requests itself.
	PeerLeft Left
	// PeerWrites is the peer replicas' decayed cache writes to the worker as of
	// Input.Now, tokens (WriteSharer.Writes of each peer, decayed since it was
	// reported): with it, a policy's writes and offered utilization describe the
	// worker's whole load, not the share routed by this replica.
	PeerWrites float64
}

// WriteSharer is a policy that keeps decayed cache writes per worker (uncached prompt
// tokens routed there, each counting 0.5^(age/WriteHalfLife())): the router reports
// them to peer replicas and hands theirs back in Candidate.PeerWrites.
type WriteSharer interface {
	// Writes returns this policy's decayed writes to worker as of now, tokens (0 unknown).
	Writes(worker string, now time.Time) float64
	// WriteHalfLife is the half-life the writes decay with (≤ 0: they do not).
	WriteHalfLife() time.Duration
}

// Left counts requests that left a worker's waiting queue and running set after its
// last scrape.
type Left struct {
	Waiting int `json:"waiting"` // got their first token (or ended before it)
	Running int `json:"running"` // finished after their first token
}

// Input is the request as scoring sees it.
type Input struct {
	RequestID string
	Request   *request.Request // the parsed request (for text-based baselines); may be nil
	Model     string
	// Adapter is the LoRA adapter the request names (its model field, when the model is
	// configured as an adapter of a base model); "" for a base-model request.
	Adapter      string
	PromptTokens int           // prompt length in tokens; 0 when tokenization was unavailable
	Tokens       []uint32      // prompt token ids; nil when unavailable
	Keys         []kvindex.Key // block keys of Tokens; nil when unavailable
	BlockSize    int           // tokens per KV block for this model
	MaxTokens    int           // requested output limit; 0 unknown
	// KVBytesPerToken is the model's KV cache size per token, bytes (the model's
	// router.Model.KVBytesPerToken); 0 → Options.KVBytesPerToken. It prices the
	// prefill→decode KV transfer of a disaggregated pair (pd.go).
	KVBytesPerToken float64
	SLO             time.Duration // per-request TTFT objective (x-slo-ttft-ms); 0 none
	// RefuseOnSLOMiss sheds this request (Decision.Shed, Reason ReasonSLO) when no
	// worker is predicted within SLO, as Options.ShedOnSLOMiss does for every request.
	RefuseOnSLOMiss bool
	// RefuseAbove, with RefuseOnSLOMiss, is the predicted TTFT past which the request is
	// refused: the SLO divided by the router's learned margin (0 = the SLO).
	RefuseAbove time.Duration
	Degraded    string // why routing information is missing ("" = full information)
	Now         time.Time
	// DryRun is set by explain requests: the policy must decide exactly as it would, but
	// change no state (no round-robin advance, no LRU/tree insert) and count no metrics.
	DryRun bool
	// Scratch, when set, is the working memory the policy keeps its per-candidate
	// slices in (Scratch's doc); the Decision's Predictions then live in it. nil: the
	// pick allocates its own.
	Scratch *Scratch

	prepared *prepared // set by a Preparer's Prepare for the Pick that follows
}

// Prediction is a predicted TTFT and its terms, all in seconds of wall time.
// TTFT = Queue + Prefill + Overhead + Adapter (+ Transfer for a prefill/decode pair).
type Prediction struct {
	TTFT     time.Duration
	Queue    time.Duration // waiting behind prefill work and decode interference already on the worker
	Prefill  time.Duration // prefilling this request's uncached tokens (+ lower-tier transfer)
	Overhead time.Duration // fixed per-request time
	Adapter  time.Duration // loading the request's LoRA adapter there (and waiting for a slot); 0 when loaded or none
	// Transfer is moving the prefilled KV from the prefill worker to the decode worker
	// of a disaggregated pair (PairDecision), with the decode worker's wait for its first
	// step; 0 for a local prefill.
	Transfer time.Duration
	// Features are the model's terms under the worker's prior coefficients, in seconds
	// (see Features); the learner regresses the observed TTFT on them. Zero for
	// policies that do not predict.
	Features Features
}

// Pick reasons (the values of Decision.Reason for kvroute's own policy).
const (
	ReasonBest     = "best"     // lowest predicted TTFT, clear winner
	ReasonTie      = "tie"      // near-tie broken by fewest in-flight tokens, then at random
	ReasonSLO      = "slo"      // chosen among workers predicted to meet the request's SLO
	ReasonDegraded = "degraded" // no token information: load only
	ReasonPolicy   = "policy"   // a baseline policy's own choice
	ReasonExplore  = "explore"  // decided with the pool's factors (Options.ExploreFraction)
)

// Decision is a policy's answer.
type Decision struct {
	Index       int          // index into the candidates; -1 when Shed
	Reason      string       // one of the Reason constants
	Predictions []Prediction // one per candidate when the policy predicts; may be nil
	Shed        bool         // refuse the request (429): even the best prediction is too slow
	RetryAfter  time.Duration
}

// Policy chooses a worker. Pick is never called concurrently with itself (the router
// serializes it) and must not block; cands is non-empty and sorted by worker name.
type Policy interface {
	Name() string
	Pick(in *Input, cands []Candidate) Decision
}

// Observation is what happened to one routed request, handed back for learning.
type Observation struct {
	Worker       string
	PromptTokens int
	CachedTokens int    // what the index predicted at pick time
	Booked       Booked // the worker's bookings at pick time (this request excluded)
	Load         workers.Load
	Predicted    Prediction    // zero if the policy does not predict
	Start        time.Time     // when the request was picked (Input.Now); zero unknown
	TTFT         time.Duration // observed time to first token; 0 when not observed
	E2E          time.Duration // observed end-to-end latency; 0 when not finished
	Usage        response.Usage
	Status       int // upstream HTTP status; 0 unknown
}

// Learner is implemented by policies that learn from observations. Observe may be
// called concurrently with Pick and with itself, and must not block.
//
// A request whose first token was observed is reported twice: at first token (TTFT>0,
// E2E==0) and at completion (same TTFT, E2E>0, Usage). Learners learn TTFT from the
// first report only; the completion report carries usage (cached_tokens drift).
// A non-streamed request is reported once, at completion, with TTFT==0. The completion
// report comes only for requests whose outcome is ok (response.OutcomeOK, router
// Ticket.Complete): an error, truncated or aborted request gets its first-token report
// (when it produced one) and nothing more.
type Learner interface {
	Observe(o Observation)
}
