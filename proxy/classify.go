package proxy

import (
	"net/http"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/tracing"
)

// classify runs the classify stage (front.Classify) and applies its model rewrite: the
// body returned is the one to send upstream, and req.Model, which the pick reads, is the
// rewritten model (the proxy owns the body, so a rewrite is skipped only for a body that
// is not a JSON object). With the stage off it returns a zero decision and body as is.
func (h *handler) classify(route *tracing.Route, r *http.Request, tenant string, req *request.Request, body []byte) (classify.Decision, []byte, error) {
	rs := h.opt.Classify
	if rs == nil { // off: nothing built, nothing run
		return classify.Decision{}, body, nil
	}
	cd, err := front.Classify(rs, route, classify.Input{Path: r.URL.Path, Tenant: tenant, Header: r.Header.Get, Req: req, Ctx: r.Context()})
	if err != nil {
		return cd, body, err
	}
	if nb, ok := rs.Rewrite(cd, req, body, true, h.opt.Router.MaxPromptIDs()); ok {
		route.Set(tracing.Model(req.Model))
		body = nb
	}
	return cd, body, nil
}
