package peers

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// The receive path past the decoder: whatever decodes is applied (clamped, its keys
// booked) and published to a real router and index, and what the router then holds
// stays within the claim bounds and prices to a finite, non-negative TTFT. Two
// summaries per input: the second replaces the first (or is stale).
func FuzzReceive(f *testing.F) {
	f.Add(encode(nil, sampleSummary()), encode(nil, &Summary{Replica: "r1", Incarnation: 7, Seq: 43}))
	huge := &Summary{Replica: "liar", Incarnation: 1, Seq: 1, Sent: time.Now().Add(time.Hour),
		Workers: []WorkerSummary{{Worker: "w0", Booked: scoring.Booked{Requests: 1 << 39, Prefilling: 1 << 39, PrefillTokens: 1 << 39, Decoding: 1 << 39}, Writes: 1 << 39}}}
	f.Add(encode(nil, huge), encode(nil, sampleSummary()))
	f.Add([]byte{wireVersion, 0}, []byte{})
	r, ix, ms := testRouter()
	claims := Claims{MaxRequests: 64, MaxPromptTokens: 1024}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		m, err := New(Options{ID: "me", Router: r, Index: ix, Metrics: ms.Peers, Claims: claims, Auth: Auth{Token: "t"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range [][]byte{a, b} {
			if s, err := decode(msg, m.lim); err == nil {
				_ = m.apply(s, 1, "127.0.0.1:9", len(msg))
			}
		}
		m.publish()
		peers := len(m.Snapshot().Peers) // the bounds are per peer; the router holds their sum
		for name, pw := range r.PeerBookings() {
			bk := pw.Booked
			if bk.Requests < 0 || bk.Requests > peers*claims.MaxRequests || bk.Prefilling+bk.Decoding > bk.Requests ||
				bk.PrefillTokens < 0 || bk.PrefillTokens > bk.Prefilling*claims.MaxPromptTokens {
				t.Fatalf("%s: imported %+v from %d peers past the claim bounds %+v each", name, bk, peers, claims)
			}
			for _, w := range pw.Writes {
				if w.Tokens < 0 || w.Tokens > float64(claims.MaxRequests*claims.MaxPromptTokens) || w.At.After(time.Now()) {
					t.Fatalf("%s: writes %+v", name, w)
				}
			}
		}
		p := (&scoring.Simple{}).Predict(&scoring.Input{PromptTokens: 64, BlockSize: 16, Now: time.Now()},
			&scoring.Candidate{Worker: &workers.Worker{Name: "w0"}, Booked: r.PeerBookings()["w0"].Booked})
		if p.TTFT < 0 || p.TTFT > 3*scoring.MaxPredictedTerm {
			t.Fatalf("TTFT %v", p.TTFT)
		}
		m.dropAll() // the next input starts clean
	})
}
