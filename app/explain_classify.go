package app

import (
	"net/http"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
)

// ExplainClassify is what the classify stage decides for an explained request: the
// classifiers' labels and the rule that matched with its actions, as both fronts would
// apply them.
type ExplainClassify struct {
	Rule             string  `json:"rule,omitempty"` // "" no rule matched
	Action           string  `json:"action"`         // as kvroute_classify_decisions_total counts it
	Label            string  `json:"label,omitempty"`
	Confidence       float64 `json:"confidence,omitempty"`
	RemoteLabel      string  `json:"remote_label,omitempty"`
	RemoteConfidence float64 `json:"remote_confidence,omitempty"`
	// The actions: Refuse (403) and Unavailable (503) end the request there; Class is its
	// admission class; Workers the pool the pick is made in; Model the model it is
	// rewritten to (the explained pick is made for it); Tag the upstream tag header.
	Refuse      bool     `json:"refuse,omitempty"`
	Unavailable bool     `json:"unavailable,omitempty"`
	Class       string   `json:"class,omitempty"`
	Workers     []string `json:"workers,omitempty"`
	Model       string   `json:"model,omitempty"`
	Tag         string   `json:"tag,omitempty"`
}

// explainClassify runs the classify stage on an explained request without counting its
// decision (Rules.Explain), and applies its pool and model rewrite to the pick to
// explain. It returns nil with the stage off. A refusing decision is the whole answer:
// stop is then true. The explain has no tenant (no identity is checked there).
func (a *App) explainClassify(r *http.Request, path string, req *request.Request, opt *router.PickOptions) (ec *ExplainClassify, stop bool) {
	if a.Classify == nil {
		return nil, false
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	d := a.Classify.Explain(classify.Input{Path: path, Header: r.Header.Get, Req: req, Ctx: r.Context()})
	ec = &ExplainClassify{Rule: d.Rule, Action: d.Action(), Label: d.Label, Confidence: d.Confidence,
		RemoteLabel: d.RemoteLabel, RemoteConfidence: d.RemoteConfidence, Refuse: d.Refuse, Unavailable: d.Unavailable,
		Class: d.Class, Workers: d.Workers, Model: d.Model}
	for _, h := range d.Header {
		if h[0] == classify.TagHeader {
			ec.Tag = h[1]
		}
	}
	if d.Refuse || d.Unavailable {
		return ec, true
	}
	if len(d.Workers) > 0 {
		opt.Subset, opt.SubsetHint = d.Workers, true
	}
	if d.Model != "" {
		req.Model = d.Model
	}
	return ec, false
}
