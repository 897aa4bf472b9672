package classify

import "github.com/kvroute/kvroute/request"

// Rewrite applies d's model rewrite, when it has one, to the body a front sends
// upstream (request.WithModel) and to req.Model, so that the pick is made among the new
// model's workers; it returns the body to send and whether it changed. mutable says
// whether the front may replace the body at all (ext_proc cannot in every request body
// mode); when it may not, or the body is not a JSON object, the rewrite is skipped and
// req keeps its model. Each rewrite is counted by rule and outcome (applied, skipped).
// maxElems bounds each array of the body while it is parsed again (0: none).
func (rs *Rules) Rewrite(d Decision, req *request.Request, body []byte, mutable bool, maxElems int) ([]byte, bool) {
	if d.Model == "" || req == nil {
		return body, false
	}
	out, ok := body, false
	if mutable {
		out, ok = request.WithModel(body, d.Model, maxElems)
	}
	if rs.rewrites != nil {
		outcome := "applied"
		if !ok {
			outcome = "skipped"
		}
		rs.rewrites.WithLabelValues(d.Rule, outcome).Inc()
	}
	if ok {
		req.Model = d.Model
	}
	return out, ok
}
