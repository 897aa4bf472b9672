// Package scoringtest holds scoring policies for other packages' tests, as net/http/httptest
// does for HTTP: deterministic, with predictions a test can compute by hand.
package scoringtest

import (
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Busy predicts 1 s of TTFT per request booked on a worker (scoring.Booked.Requests:
// this replica's and its peers') and picks the lowest, the first on a tie. Tests of
// the admission queue use it: it needs only predictions and bookings.
type Busy struct{}

// Name is "busy".
func (Busy) Name() string { return "busy" }

// Pick predicts TTFT = Booked.Requests × 1 s for every candidate and picks the lowest.
func (Busy) Pick(_ *scoring.Input, cands []scoring.Candidate) scoring.Decision {
	preds := make([]scoring.Prediction, len(cands))
	best := 0
	for i, c := range cands {
		preds[i].TTFT = time.Duration(c.Booked.Requests) * time.Second
		if preds[i].TTFT < preds[best].TTFT {
			best = i
		}
	}
	return scoring.Decision{Index: best, Reason: scoring.ReasonBest, Predictions: preds}
}
