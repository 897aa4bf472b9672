package envoy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Names of the Envoy extensions kvroute's configuration relies on.
const (
	ExtProcFilter = "envoy.filters.http.ext_proc"
	RouterFilter  = "envoy.filters.http.router"
	// JWTAuthnFilter is Envoy's JWT filter; it writes verified payloads under this
	// dynamic metadata namespace whatever the filter is named in the configuration.
	JWTAuthnFilter      = "envoy.filters.http.jwt_authn"
	HTTPProtocolOptions = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// Sentinel errors of Check, one per rule; each problem wraps one of them.
var (
	ErrMissing           = errors.New("required part missing")
	ErrUnknownCluster    = errors.New("reference to an undefined cluster")
	ErrOriginalDst       = errors.New("ORIGINAL_DST cluster misconfigured")
	ErrDestinationHeader = errors.New("destination header differs from kvroute's")
	ErrExtProcNotHTTP2   = errors.New("ext_proc cluster is not HTTP/2")
	ErrNoHealthCheck     = errors.New("ext_proc cluster has no gRPC health check")
	ErrOneReplica        = errors.New("ext_proc cluster reaches one kvroute replica at a time")
	ErrProcessingMode    = errors.New("ext_proc processing mode unusable by kvroute")
	ErrFullDuplex        = errors.New("FULL_DUPLEX_STREAMED misconfigured")
	ErrMetadataNamespace = errors.New("ext_proc does not accept kvroute's metadata namespace")
	ErrModeOverride      = errors.New("ext_proc allows mode override")
	ErrFilterOrder       = errors.New("ext_proc must come before the router")
	ErrClientHeader      = errors.New("a client-supplied routing header reaches Envoy's routing")
	ErrFailOpen          = errors.New("without kvroute's pick a request could reach a client-chosen worker or none")
	ErrJWT               = errors.New("the verified JWT payload does not reach kvroute's admission")
	ErrMessageTimeout    = errors.New("ext_proc message_timeout shorter than kvroute may hold a request")
)

// EarlyHeaderMutation is the early header mutation extension that strips client headers.
const EarlyHeaderMutation = "envoy.http.early_header_mutation.header_mutation"

// Expect is what Check compares the Envoy configuration with: kvroute's own settings.
type Expect struct {
	// DestinationHeader is kvroute's extproc.destination_header; every ORIGINAL_DST
	// cluster must read it.
	DestinationHeader string
	// MetadataNamespace is kvroute's extproc.metadata_namespace ("" = not required).
	MetadataNamespace string
	// KnownClusters are clusters defined elsewhere (e.g. by Istio) that references may
	// name.
	KnownClusters []string
	// TenantHeader is kvroute's admission.tenant_header ("" = not required): ext_proc
	// believes it as set by the edge, so the client's copy must be removed first.
	TenantHeader string
	// ClaimNamespace and ClaimKey are kvroute's admission.metadata_namespace and
	// admission.metadata_key ("" = not compared): where admission reads the verified
	// JWT payload in metadata_context. Checked only where a jwt_authn filter exists.
	ClaimNamespace, ClaimKey string
	// MaxQueueTime is the longest admission max_queue_time of the kvroute
	// configurations the bootstrap serves (config.Admission.MaxQueueTime; 0 = no
	// queue). kvroute holds a queued request's headers reply (BUFFERED: its body reply)
	// that long, so every ext_proc filter whose request body mode is not
	// FULL_DUPLEX_STREAMED (where message_timeout does not apply) needs message_timeout
	// ≥ MaxQueueTime + DecisionBudget, else Envoy answers 504 (fail closed) or skips
	// kvroute (fail open) while the request waits.
	MaxQueueTime time.Duration
}

// DecisionBudget is the message_timeout the shipped bootstraps give one decision
// without a queue (parsing and tokenizing a large BUFFERED body on a busy machine):
// the margin above MaxQueueTime.
const DecisionBudget = 2 * time.Second

// StrippedHeaders are the client request headers every configuration must remove
// before ext_proc and routing: the destination kvroute sets, and its "-served" twin
// (Gateway API Inference Extension) that routing may read, and the tenant header
// when Expect.TenantHeader is set (admission believes it in ext_proc).
func (e Expect) StrippedHeaders() []string {
	out := []string{e.DestinationHeader, e.DestinationHeader + "-served"}
	if e.TenantHeader != "" {
		out = append(out, e.TenantHeader)
	}
	return out
}

// Check verifies what protobuf rules cannot, across every message reachable from roots
// (Any payloads included): at least one ext_proc filter and one ORIGINAL_DST cluster
// exist; every referenced cluster is defined; ORIGINAL_DST clusters use
// CLUSTER_PROVIDED and read e.DestinationHeader; each ext_proc cluster speaks HTTP/2
// and has a gRPC health check, and holds every kvroute replica as a host (not
// LOGICAL_DNS, which keeps one address); request headers are sent (kvroute must see the request
// to route it); FULL_DUPLEX_STREAMED has trailers SEND and no failure_mode_allow; the
// metadata namespace is accepted; mode override is off; and in every
// http_connection_manager the ext_proc filter precedes the router, which is last; where
// a jwt_authn filter exists it runs before ext_proc, writes payload_in_metadata and
// ext_proc forwards its namespace (checkJWT). It returns every problem found, joined; each wraps one of the sentinel errors.
func Check(e Expect, roots ...proto.Message) error {
	var (
		clusters = map[string]*clusterv3.Cluster{}
		refs     []string
		extprocs []*extprocv3.ExternalProcessor
		hcms     []*hcmv3.HttpConnectionManager
		jwts     []*jwtv3.JwtAuthentication
		vhosts   []*routev3.VirtualHost
		removed  = map[string]bool{}
		errs     []error
	)
	bad := func(sentinel error, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...)))
	}
	for _, r := range roots {
		err := Walk(r, func(m proto.Message, _ bool) error {
			switch x := m.(type) {
			case *clusterv3.Cluster:
				clusters[x.GetName()] = x
			case *routev3.RouteAction:
				if c := x.GetCluster(); c != "" {
					refs = append(refs, c)
				}
			case *routev3.WeightedCluster_ClusterWeight:
				refs = append(refs, x.GetName())
			case *corev3.GrpcService_EnvoyGrpc:
				refs = append(refs, x.GetClusterName())
			case *extprocv3.ExternalProcessor:
				extprocs = append(extprocs, x)
			case *hcmv3.HttpConnectionManager:
				hcms = append(hcms, x)
			case *jwtv3.JwtAuthentication:
				jwts = append(jwts, x)
			case *routev3.VirtualHost:
				vhosts = append(vhosts, x)
			case *earlyv3.HeaderMutation:
				for _, m := range x.GetMutations() {
					if r, ok := m.GetAction().(*mutationv3.HeaderMutation_Remove); ok {
						removed[r.Remove] = true
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, r := range refs {
		if _, ok := clusters[r]; !ok && !slices.Contains(e.KnownClusters, r) {
			bad(ErrUnknownCluster, "cluster %q is referenced but not defined", r)
		}
	}
	if len(extprocs) == 0 {
		bad(ErrMissing, "no %s filter", ExtProcFilter)
	}
	originalDst := 0
	for _, name := range sortedKeys(clusters) {
		c := clusters[name]
		if c.GetType() != clusterv3.Cluster_ORIGINAL_DST {
			continue
		}
		originalDst++
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			bad(ErrOriginalDst, "cluster %q: lb_policy %s, want CLUSTER_PROVIDED", name, c.GetLbPolicy())
		}
		if c.GetLoadAssignment() != nil {
			bad(ErrOriginalDst, "cluster %q: an ORIGINAL_DST cluster takes no load_assignment", name)
		}
		od := c.GetOriginalDstLbConfig()
		if !od.GetUseHttpHeader() {
			bad(ErrOriginalDst, "cluster %q: original_dst_lb_config.use_http_header must be true", name)
		}
		if h := od.GetHttpHeaderName(); h != e.DestinationHeader {
			bad(ErrDestinationHeader, "cluster %q reads %q, kvroute writes %q", name, h, e.DestinationHeader)
		}
	}
	if originalDst == 0 {
		bad(ErrMissing, "no ORIGINAL_DST cluster to route to the worker kvroute picks")
	}
	for i, x := range extprocs {
		where := fmt.Sprintf("ext_proc filter #%d", i+1)
		if name := x.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name == "" {
			bad(ErrMissing, "%s: grpc_service.envoy_grpc.cluster_name is required", where)
		} else if c, ok := clusters[name]; ok {
			if !isHTTP2(c) {
				bad(ErrExtProcNotHTTP2, "%s: cluster %q needs typed_extension_protocol_options %s with explicit_http_config.http2_protocol_options", where, name, HTTPProtocolOptions)
			}
			if !hasGRPCHealthCheck(c) {
				bad(ErrNoHealthCheck, "%s: cluster %q has no grpc_health_check", where, name)
			}
			if c.GetType() == clusterv3.Cluster_LOGICAL_DNS {
				// LOGICAL_DNS keeps one host, the first address the name resolves to:
				// with several kvroute replicas behind the name, every stream and every
				// health check goes to one of them and a dead one is not ejected alone.
				bad(ErrOneReplica, "%s: cluster %q is LOGICAL_DNS (one host); use STRICT_DNS over a name resolving to every replica (a headless Service), STATIC or EDS endpoints", where, name)
			}
		}
		pm := x.GetProcessingMode()
		if pm.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP {
			bad(ErrProcessingMode, "%s: request_header_mode SKIP: kvroute would never see requests", where)
		}
		if pm.GetResponseHeaderMode() == extprocv3.ProcessingMode_SKIP {
			bad(ErrProcessingMode, "%s: response_header_mode SKIP: kvroute could not observe first tokens or release bookings", where)
		}
		const fd = extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if pm.GetRequestBodyMode() == fd && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
			bad(ErrFullDuplex, "%s: request_body_mode FULL_DUPLEX_STREAMED requires request_trailer_mode SEND", where)
		}
		if pm.GetResponseBodyMode() == fd && pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
			bad(ErrFullDuplex, "%s: response_body_mode FULL_DUPLEX_STREAMED requires response_trailer_mode SEND", where)
		}
		if (pm.GetRequestBodyMode() == fd || pm.GetResponseBodyMode() == fd) && x.GetFailureModeAllow() {
			bad(ErrFullDuplex, "%s: failure_mode_allow cannot be used with FULL_DUPLEX_STREAMED", where)
		}
		if ns := e.MetadataNamespace; ns != "" && !slices.Contains(x.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), ns) {
			bad(ErrMetadataNamespace, "%s: metadata_options.receiving_namespaces.untyped must contain %q", where, ns)
		}
		if x.GetAllowModeOverride() {
			bad(ErrModeOverride, "%s: allow_mode_override must be false", where)
		}
		if e.MaxQueueTime > 0 && pm.GetRequestBodyMode() != fd {
			mt := 200 * time.Millisecond // Envoy's default
			if x.GetMessageTimeout() != nil {
				mt = x.GetMessageTimeout().AsDuration()
			}
			if need := e.MaxQueueTime + DecisionBudget; mt < need {
				bad(ErrMessageTimeout, "%s: message_timeout %s < %s (max_queue_time %s + %s decision budget)", where, mt, need, e.MaxQueueTime, DecisionBudget)
			}
		}
	}
	// A client never chooses its worker: the routing headers are stripped before
	// anything reads them (HCM early_header_mutation_extensions).
	if len(extprocs) > 0 {
		for _, h := range e.StrippedHeaders() {
			if !removed[h] {
				bad(ErrClientHeader, "no %s removes the client's %q before ext_proc and routing", EarlyHeaderMutation, h)
			}
		}
	}
	checkRoutes(e, clusters, vhosts, extprocs, bad)
	checkJWT(e, jwts, extprocs, bad)
	for i, h := range hcms {
		checkFilterOrder(fmt.Sprintf("http_connection_manager #%d (%s)", i+1, h.GetStatPrefix()), h.GetHttpFilters(), bad)
	}
	return errors.Join(errs...)
}

// checkRoutes: in every virtual host, a route to an ORIGINAL_DST cluster must require
// the destination header (present_match), so it is taken only when kvroute set it, and
// a later catch-all route must go to an ordinary cluster (the fail-open fallback); the
// ext_proc filter must re-select the route after kvroute's reply (route_cache_action
// CLEAR). Route fragments outside a virtual host (Istio MERGE patches) are checked by
// their own tests.
func checkRoutes(e Expect, clusters map[string]*clusterv3.Cluster, vhosts []*routev3.VirtualHost, extprocs []*extprocv3.ExternalProcessor, bad func(error, string, ...any)) {
	if len(vhosts) == 0 {
		return
	}
	for _, x := range extprocs {
		if x.GetRouteCacheAction() != extprocv3.ExternalProcessor_CLEAR {
			bad(ErrFailOpen, "ext_proc route_cache_action must be CLEAR: the route is re-selected after kvroute sets the destination")
		}
	}
	isOD := func(name string) bool {
		c, ok := clusters[name]
		return ok && c.GetType() == clusterv3.Cluster_ORIGINAL_DST
	}
	for _, vh := range vhosts {
		fallback := false
		for _, r := range vh.GetRoutes() {
			c := r.GetRoute().GetCluster()
			if c == "" {
				continue
			}
			guarded := false
			for _, hm := range r.GetMatch().GetHeaders() {
				if hm.GetName() == e.DestinationHeader && hm.GetPresentMatch() && !hm.GetInvertMatch() {
					guarded = true
				}
			}
			switch {
			case isOD(c) && !guarded:
				bad(ErrFailOpen, "virtual host %q: the route to ORIGINAL_DST cluster %q must match only when %s is present (set by kvroute)", vh.GetName(), c, e.DestinationHeader)
			case !isOD(c) && len(r.GetMatch().GetHeaders()) == 0:
				fallback = true
			}
		}
		if !fallback {
			bad(ErrFailOpen, "virtual host %q: no catch-all route to a load-balanced cluster of the workers for requests kvroute did not route", vh.GetName())
		}
	}
}

// checkJWT: where a jwt_authn filter verifies tokens, every provider writes its payload
// to metadata (payload_in_metadata, under kvroute's admission.metadata_key when
// e.ClaimKey is set) and every ext_proc filter forwards the jwt_authn namespace
// (metadata_options.forwarding_namespaces), which must be kvroute's
// admission.metadata_namespace; the filter order (jwt_authn before ext_proc) is
// checkFilterOrder's.
func checkJWT(e Expect, jwts []*jwtv3.JwtAuthentication, extprocs []*extprocv3.ExternalProcessor, bad func(error, string, ...any)) {
	if len(jwts) == 0 {
		return
	}
	if e.ClaimNamespace != "" && e.ClaimNamespace != JWTAuthnFilter {
		bad(ErrJWT, "jwt_authn writes payloads under %q, kvroute's admission.metadata_namespace is %q", JWTAuthnFilter, e.ClaimNamespace)
	}
	for _, j := range jwts {
		for _, name := range sortedKeys(j.GetProviders()) {
			switch k := j.GetProviders()[name].GetPayloadInMetadata(); {
			case k == "":
				bad(ErrJWT, "jwt_authn provider %q: payload_in_metadata is not set, kvroute sees no claim", name)
			case e.ClaimKey != "" && k != e.ClaimKey:
				bad(ErrJWT, "jwt_authn provider %q: payload_in_metadata %q, kvroute's admission.metadata_key is %q", name, k, e.ClaimKey)
			}
		}
	}
	for i, x := range extprocs {
		if !slices.Contains(x.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), JWTAuthnFilter) {
			bad(ErrJWT, "ext_proc filter #%d: metadata_options.forwarding_namespaces.untyped must contain %q", i+1, JWTAuthnFilter)
		}
	}
}

// jwtTypeURL is the typed_config type of a jwt_authn filter.
const jwtTypeURL = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"

func checkFilterOrder(where string, fs []*hcmv3.HttpFilter, bad func(error, string, ...any)) {
	if len(fs) == 0 {
		return // a MERGE fragment (Istio NETWORK_FILTER patch) lists no filters
	}
	ext, rt, jwt := -1, -1, -1
	for i, f := range fs {
		switch f.GetName() {
		case ExtProcFilter:
			if ext < 0 {
				ext = i
			}
		case RouterFilter:
			rt = i
		}
		if f.GetTypedConfig().GetTypeUrl() == jwtTypeURL {
			jwt = i
		}
	}
	if jwt >= 0 && ext >= 0 && jwt > ext {
		bad(ErrJWT, "%s: %s after ext_proc: kvroute would see the request before its token is verified", where, JWTAuthnFilter)
	}
	switch {
	case rt != len(fs)-1:
		bad(ErrFilterOrder, "%s: %s must be the last http filter", where, RouterFilter)
	case ext < 0:
		bad(ErrFilterOrder, "%s: no %s filter", where, ExtProcFilter)
	case ext > rt:
		bad(ErrFilterOrder, "%s: %s after the router never runs", where, ExtProcFilter)
	}
}

func isHTTP2(c *clusterv3.Cluster) bool {
	if c.GetHttp2ProtocolOptions() != nil { //nolint:staticcheck // deprecated form still accepted by Envoy
		return true
	}
	a, ok := c.GetTypedExtensionProtocolOptions()[HTTPProtocolOptions]
	if !ok {
		return false
	}
	var o httpv3.HttpProtocolOptions
	if err := a.UnmarshalTo(&o); err != nil {
		return false
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

func hasGRPCHealthCheck(c *clusterv3.Cluster) bool {
	for _, h := range c.GetHealthChecks() {
		if h.GetGrpcHealthCheck() != nil {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
