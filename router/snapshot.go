package router

import (
	"sort"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// WorkerState is the admin view of one worker.
type WorkerState struct {
	Name    string         `json:"name"`
	Address string         `json:"address"`
	Models  []string       `json:"models"`
	Healthy bool           `json:"healthy"`
	Booked  scoring.Booked `json:"booked"`
	Load    workers.Load   `json:"load"`
	Role    workers.Role   `json:"role,omitempty"` // prefill/decode role (docs/pd.md); "" aggregated
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
	// PrefillWorker is the worker prefilling remotely while the prefill leg is open
	// (docs/pd.md); "" none.
	PrefillWorker string `json:"prefill_worker,omitempty"`
}

// Snapshot returns the workers with their bookings and the open tickets, oldest first.
func (r *Router) Snapshot() ([]WorkerState, []TicketState) {
	now := r.opt.Now()
	ws := r.opt.Registry.All()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerState, 0, len(ws))
	for _, w := range ws {
		s := WorkerState{Name: w.Name, Address: w.Address, Models: w.Models, Healthy: r.opt.Registry.Healthy(w.Name), Load: r.opt.Registry.Load(w.Name), Role: w.Role}
		if f := r.flights[w.Name]; f != nil {
			s.Booked = f.booked
		}
		out = append(out, s)
	}
	ts := make([]TicketState, 0, len(r.tickets))
	for _, t := range r.tickets {
		ts = append(ts, TicketState{RequestID: t.RequestID, Worker: t.on, Model: t.Model, PromptTokens: t.PromptTokens,
			CachedTokens: t.CachedTokens, FirstToken: t.firstAt != (time.Time{}), Age: now.Sub(t.Start), PredictedTTFT: t.Predicted.TTFT,
			PrefillWorker: t.pf.on})
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
