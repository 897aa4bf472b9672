package app

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// ExplainPathHeader selects the API of an explained body when the "path" query
// parameter is absent: e.g. "/v1/completions". Default: /v1/chat/completions.
const ExplainPathHeader = "X-Kvroute-Path"

// explainTimeout bounds one /debug/explain call, remote tokenization included.
const explainTimeout = 10 * time.Second

// ExplainWorker is one candidate in the explain view; durations are in seconds.
type ExplainWorker struct {
	Worker          string         `json:"worker"`
	Role            string         `json:"role,omitempty"` // prefill, decode or both (docs/pd.md); "" aggregated
	CachedTokens    int            `json:"cached_tokens"`
	CachedBlocks    map[string]int `json:"cached_blocks_by_tier,omitempty"`
	Booked          scoring.Booked `json:"booked"`
	Load            workers.Load   `json:"load"`
	QueueSeconds    float64        `json:"queue_seconds"`
	PrefillSeconds  float64        `json:"prefill_seconds"`
	OverheadSeconds float64        `json:"overhead_seconds"`
	AdapterSeconds  float64        `json:"adapter_seconds,omitempty"` // loading the request's LoRA adapter there (docs/lora.md)
	PredictedTTFT   float64        `json:"predicted_ttft_seconds"`
	Chosen          bool           `json:"chosen"`
}

// ExplainResponse is the body of GET /debug/explain.
type ExplainResponse struct {
	Policy       string          `json:"policy"`
	Model        string          `json:"model"`
	API          request.API     `json:"api"`
	PromptTokens int             `json:"prompt_tokens"`
	Tokenization string          `json:"tokenization"`
	Degraded     string          `json:"degraded,omitempty"`
	SLOSeconds   float64         `json:"slo_seconds,omitempty"`
	Chosen       string          `json:"chosen,omitempty"` // "" when shed
	Reason       string          `json:"reason"`
	Shed         bool            `json:"shed"`
	RetryAfter   float64         `json:"retry_after_seconds,omitempty"`
	Workers      []ExplainWorker `json:"workers"`
	// Pair is the pair pick on a pool with prefill/decode roles (docs/pd.md); absent on
	// an aggregated pool. Chosen is then its decode worker.
	Pair *ExplainPair `json:"pair,omitempty"`
	// Classify is the classify stage's decision (explain_classify.go); absent with the
	// stage off. When it refuses, nothing else is explained (Reason says so).
	Classify *ExplainClassify `json:"classify,omitempty"`
}

// ExplainPair is the prefill/decode pair the router would pick; durations in seconds.
type ExplainPair struct {
	DecodeWorker  string `json:"decode_worker,omitempty"`  // "" when shed
	PrefillWorker string `json:"prefill_worker,omitempty"` // "" when the decode worker prefills locally
	// Decision is "remote" (PrefillWorker prefills, its KV moves to DecodeWorker) or
	// "local" (DecodeWorker prefills itself), as kvroute_router_pd_decisions_total counts.
	Decision string `json:"decision,omitempty"`
	// TransferSeconds is the predicted time from the end of the remote prefill to the
	// decode worker's first step (0 local); PredictedTTFT the pair's, transfer included.
	TransferSeconds float64 `json:"transfer_seconds"`
	PredictedTTFT   float64 `json:"predicted_ttft_seconds"`
	// PrefillPredictedTTFT is the prefill worker's own prediction for the prefill leg.
	PrefillPredictedTTFT float64 `json:"prefill_predicted_ttft_seconds,omitempty"`
}

// debugExplain answers GET /debug/explain: the body is a request as a client would send
// it (API chosen by ?path=/v1/… or the X-Kvroute-Path header, default chat completions;
// SLO by the configured SLO header), and the answer is what the router would decide for
// it now, per worker, without booking, speculating or advancing any policy state.
func (a *App) debugExplain(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if path == "" {
		path = r.Header.Get(ExplainPathHeader)
	}
	api := request.APIChat
	if path != "" {
		api = request.APIForPath(path)
	}
	// At most server.admin_explain_concurrency explains at once: each may tokenize
	// remotely (a worker's POST /tokenize), so an admin client cannot turn the port into
	// a tokenization flood against the workers.
	select {
	case a.explainSem <- struct{}{}:
		defer func() { <-a.explainSem }()
	default:
		explainError(w, http.StatusTooManyRequests, "rate_limit_error", "too many concurrent /debug/explain calls (server.admin_explain_concurrency)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), explainTimeout)
	defer cancel()
	maxExplainBody := a.Config.Server.AdminExplainMaxBodyBytes
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(maxExplainBody)+1))
	if err != nil {
		explainError(w, http.StatusBadRequest, "invalid_request_error", "cannot read body: "+err.Error())
		return
	}
	if len(body) > maxExplainBody {
		explainError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body too large")
		return
	}
	req, err := request.Parse(api, body)
	if err != nil {
		if e, ok := request.AsError(err); ok {
			explainError(w, e.Status, e.Type, e.Message)
			return
		}
		explainError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	opt := router.PickOptions{RequestID: "explain"}
	if h := a.Config.ExtProc.SLOHeader; h != "" {
		if v := r.Header.Get(h); v != "" {
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil || ms <= 0 {
				explainError(w, http.StatusBadRequest, "invalid_request_error", h+" must be a positive number of milliseconds")
				return
			}
			opt.SLO = time.Duration(ms * float64(time.Millisecond))
		}
	}
	cls, stop := a.explainClassify(r, path, req, &opt)
	if stop {
		writeJSON(w, http.StatusOK, ExplainResponse{Policy: a.Router.Policy().Name(), Model: req.Model, API: api,
			Reason: "refused by classification rule " + cls.Rule, Workers: []ExplainWorker{}, Classify: cls})
		return
	}
	ex, err := a.Router.Explain(ctx, req, opt)
	if err != nil {
		var re *router.Error
		if errors.As(err, &re) {
			explainError(w, re.Status, re.Type, re.Message)
			return
		}
		explainError(w, http.StatusInternalServerError, "internal_error", err.Error())
		return
	}
	out := explainResponse(a.Router.Policy().Name(), api, ex)
	out.Classify = cls
	writeJSON(w, http.StatusOK, out)
}

func explainResponse(policy string, api request.API, ex *router.Explanation) ExplainResponse {
	d := ex.Decision
	out := ExplainResponse{Policy: policy, Model: ex.Input.Model, API: api, PromptTokens: ex.Input.PromptTokens,
		Tokenization: string(ex.Path), Degraded: ex.Input.Degraded, SLOSeconds: ex.Input.SLO.Seconds(),
		Reason: d.Reason, Shed: d.Shed, RetryAfter: d.RetryAfter.Seconds(), Workers: make([]ExplainWorker, len(ex.Candidates))}
	tiers := [...]string{kvindex.TierGPU: "gpu", kvindex.TierCPU: "cpu", kvindex.TierDisk: "disk", kvindex.TierOther: "other"}
	for i, c := range ex.Candidates {
		ew := ExplainWorker{Worker: c.Worker.Name, Role: string(c.Worker.Role), CachedTokens: c.CachedTokens, Booked: c.Booked, Load: c.Load,
			Chosen: !d.Shed && d.Index == i}
		for t, n := range c.Cached.ByTier {
			if n > 0 {
				if ew.CachedBlocks == nil {
					ew.CachedBlocks = map[string]int{}
				}
				ew.CachedBlocks[tiers[t]] = n
			}
		}
		if i < len(d.Predictions) {
			p := d.Predictions[i]
			ew.QueueSeconds, ew.PrefillSeconds, ew.OverheadSeconds, ew.PredictedTTFT =
				p.Queue.Seconds(), p.Prefill.Seconds(), p.Overhead.Seconds(), p.TTFT.Seconds()
			ew.AdapterSeconds = p.Adapter.Seconds()
		}
		if ew.Chosen {
			out.Chosen = c.Worker.Name
		}
		out.Workers[i] = ew
	}
	if pd := ex.Pair; pd != nil {
		out.Pair = explainPair(pd, ex)
	}
	return out
}

// explainPair is the explain view of the pair pick pd.
func explainPair(pd *scoring.PairDecision, ex *router.Explanation) *ExplainPair {
	out := &ExplainPair{}
	if pd.Shed || pd.Index < 0 || pd.Index >= len(ex.Candidates) {
		return out
	}
	out.DecodeWorker, out.Decision = ex.Candidates[pd.Index].Worker.Name, "local"
	p := pd.Predicted
	if p.TTFT <= 0 && pd.Index < len(pd.Predictions) {
		p = pd.Predictions[pd.Index] // a policy without pair predictions: its own
	}
	out.PredictedTTFT, out.TransferSeconds = p.TTFT.Seconds(), p.Transfer.Seconds()
	if q := pd.Prefill; q >= 0 && q < len(ex.Candidates) && q != pd.Index {
		out.PrefillWorker, out.Decision = ex.Candidates[q].Worker.Name, "remote"
		out.PrefillPredictedTTFT = pd.PrefillPredicted.TTFT.Seconds()
	}
	return out
}

func explainError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(request.ErrorJSON(status, typ, "", msg))
}
