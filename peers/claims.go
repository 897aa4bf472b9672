package peers

import (
	"time"

	"github.com/kvroute/kvroute/router"
)

// Claims bounds what one peer may claim on one worker: what a real replica could hold
// there. A summary is a peer's word, and the router prices it as load (a booked
// request lengthens the predicted TTFT), so a claim past these bounds is cut to them,
// counted in kvroute_peers_clamped_total, and the rest of the summary applied.
type Claims struct {
	// MaxRequests bounds the booked requests (and so the prefilling and decoding ones):
	// a small multiple of a worker's vLLM --max-num-seqs (256 or 1024 by default,
	// vllm/engine/arg_utils.py), since a replica's bookings beyond it wait in its
	// own queue when router saturation queueing is on.
	MaxRequests int
	// MaxPromptTokens bounds one request's prompt (router.max_prompt_tokens): the
	// booked prefill tokens are at most Prefilling × MaxPromptTokens, the decayed
	// writes at most MaxRequests × MaxPromptTokens.
	MaxPromptTokens int
}

// DefaultClaims are Claims' zero fields' values.
var DefaultClaims = Claims{MaxRequests: 4096, MaxPromptTokens: router.DefaultMaxPromptTokens}

func (c Claims) withDefaults() Claims {
	if c.MaxRequests <= 0 {
		c.MaxRequests = DefaultClaims.MaxRequests
	}
	if c.MaxPromptTokens <= 0 {
		c.MaxPromptTokens = DefaultClaims.MaxPromptTokens
	}
	return c
}

// clamp cuts ws's claims to c and its times to now; it reports whether anything was cut.
// Decoded counts are at most 2^40 (maxCount), so the products below cannot overflow.
func (c Claims) clamp(ws *WorkerSummary, sent time.Time) bool {
	b := ws.Booked
	cut := func(v *int, limit int) {
		*v = min(max(*v, 0), limit)
	}
	cut(&b.Requests, c.MaxRequests)
	cut(&b.Prefilling, b.Requests)
	cut(&b.Decoding, b.Requests-b.Prefilling)
	cut(&b.PrefillTokens, b.Prefilling*c.MaxPromptTokens)
	b.Unsized = 0 // not exchanged
	changed := b != ws.Booked
	ws.Booked = b
	if maxWrites := float64(c.MaxRequests) * float64(c.MaxPromptTokens); ws.Writes > maxWrites {
		ws.Writes, changed = maxWrites, true
	}
	if ws.OldestPrefill.After(sent) {
		ws.OldestPrefill, changed = sent, true
	}
	return changed
}

// clampSent bounds a summary's send time by the receiver's clock: the router decays a
// peer's writes from it (router.PeerWrites.At), and a time in the future would grow
// them instead. A peer's clock that runs ahead is treated as now.
func clampSent(s *Summary, now time.Time) {
	if s.Sent.IsZero() || s.Sent.After(now) {
		s.Sent = now
	}
}
