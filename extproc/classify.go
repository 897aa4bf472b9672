package extproc

import (
	"slices"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/tracing"
)

// classify runs the classify stage on the parsed request (front.Classify): the rule's
// class goes to admission, its tag headers to the destination reply, its workers narrow
// the pick (within the gateway's subset when it sent one), and its model rewrite is
// applied where Envoy lets kvroute replace the body (mutableRequest, a whole body: the
// body returned is then the rewritten one and req.Model the new model the pick reads);
// elsewhere it is skipped and counted so (Rules.Rewrite).
func (st *stream) classify(req *request.Request, body []byte, complete bool, how release) ([]byte, error) {
	rs := st.s.opt.Classify
	cd, err := front.Classify(rs, st.route, classify.Input{Path: st.path, Tenant: st.tenant.Tenant, Header: st.classIn.Header, Req: req, Ctx: st.ctx})
	if err != nil {
		return body, err
	}
	st.classIn.Class, st.tags = cd.Class, cd.Header
	if len(cd.Workers) > 0 { // a rule's pool, within the gateway's subset when it sent one
		if st.hasSubset {
			st.subset = slices.DeleteFunc(slices.Clone(st.subset), func(a string) bool { return !slices.Contains(cd.Workers, a) })
		} else {
			st.subset = cd.Workers
		}
		st.hasSubset = true
	}
	mutable := complete && how != releaseHeaders && mutableRequest(st.reqMode)
	if nb, ok := rs.Rewrite(cd, req, body, mutable, st.s.opt.Router.MaxPromptIDs()); ok {
		st.route.Set(tracing.Model(req.Model))
		st.bodyMutated = true
		return nb, nil
	}
	return body, nil
}
