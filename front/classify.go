package front

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tracing"
)

// Classify runs the classify stage for both fronts, between parsing and admission: the
// decision (counted by rs), its span attributes set on route, and, for a refusing rule,
// the error both fronts answer through ErrorReply (403 permission_error in the request's
// API shape), and for a fail-closed rule whose remote classifier did not answer, 503. rs nil is the stage off: a zero Decision and no work.
func Classify(rs *classify.Rules, route *tracing.Route, in classify.Input) (classify.Decision, error) {
	if rs == nil {
		return classify.Decision{}, nil
	}
	d := rs.Decide(in)
	if d.Label != "" {
		route.Set(attribute.String("kvroute.classify.label", d.Label), attribute.Float64("kvroute.classify.confidence", d.Confidence))
	}
	if d.RemoteLabel != "" {
		route.Set(attribute.String("kvroute.classify.remote_label", d.RemoteLabel), attribute.Float64("kvroute.classify.remote_confidence", d.RemoteConfidence))
	}
	if d.Rule != "" {
		route.Set(attribute.String("kvroute.classify.rule", d.Rule), attribute.String("kvroute.classify.action", d.Action()))
	}
	if d.Unavailable {
		return d, &router.Error{Status: http.StatusServiceUnavailable, Message: "request refused: the remote classifier did not answer for classification rule " + d.Rule + " (remote_fail: closed)",
			Details: "kvroute_classify_unavailable"}
	}
	if d.Refuse {
		return d, &router.Error{Status: http.StatusForbidden, Message: "request refused by classification rule " + d.Rule,
			Details: "kvroute_classify_refused"}
	}
	return d, nil
}
