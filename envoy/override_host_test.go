package envoy

import (
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	ohv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/config"
)

// The override_host variant carries the Gateway API Inference Extension protocol in full
// (docs/proposals/004-endpoint-picker-protocol): kvroute's list of endpoints (pick, then
// fallbacks) is tried in order by retries, the served endpoint comes back in envoy.lb
// metadata, the subset hint namespace is forwarded, and a client's routing headers are
// stripped before ext_proc.
func TestOverrideHostVariant(t *testing.T) {
	const file = "envoy-override-host.yaml"
	b, err := LoadBootstrap(file)
	if err != nil {
		t.Fatalf("Envoy would refuse %s: %v", file, err)
	}
	d := config.Default().ExtProc
	var (
		oh       *ohv3.OverrideHost
		ohOn     string
		ep       *extprocv3.ExternalProcessor
		stripped []string
		retries  []*routev3.RetryPolicy
		refs     []string
	)
	err = Walk(b, func(m proto.Message, _ bool) error {
		switch x := m.(type) {
		case *clusterv3.Cluster:
			for _, p := range x.GetLoadBalancingPolicy().GetPolicies() {
				var o ohv3.OverrideHost
				if p.GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&o) == nil {
					oh, ohOn = &o, x.GetName()
				}
			}
			if x.GetType() == clusterv3.Cluster_ORIGINAL_DST {
				t.Errorf("cluster %s is ORIGINAL_DST: it does not split kvroute's endpoint list", x.GetName())
			}
		case *routev3.RouteAction:
			refs = append(refs, x.GetCluster())
			retries = append(retries, x.GetRetryPolicy())
		case *extprocv3.ExternalProcessor:
			ep = x
		case *earlyv3.HeaderMutation:
			for _, mu := range x.GetMutations() {
				stripped = append(stripped, mu.GetRemove())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if oh == nil {
		t.Fatal("no cluster uses the override_host load balancing policy")
	}
	for _, r := range refs {
		if r != ohOn {
			t.Errorf("a route goes to %q, not the override_host cluster %q", r, ohOn)
		}
	}
	srcs := oh.GetOverrideHostSources()
	if len(srcs) != 2 || srcs[0].GetHeader() != d.DestinationHeader ||
		srcs[1].GetMetadata().GetKey() != d.MetadataNamespace || srcs[1].GetMetadata().GetPath()[0].GetKey() != d.DestinationHeader {
		t.Errorf("override_host sources %v: want header %s, then metadata %s/%s", srcs, d.DestinationHeader, d.MetadataNamespace, d.DestinationHeader)
	}
	if k := oh.GetSelectedHostKey(); k.GetKey() != d.MetadataNamespace || len(k.GetPath()) != 1 || k.GetPath()[0].GetKey() != d.DestinationHeader+"-served" {
		t.Errorf("selected_host_key %v: kvroute reads the served endpoint from %s/%s-served", k, d.MetadataNamespace, d.DestinationHeader)
	}
	if len(oh.GetFallbackPolicy().GetPolicies()) == 0 {
		t.Error("override_host needs a fallback policy: fail open must load balance, never 503 or a client value")
	}
	for _, rp := range retries {
		if rp.GetNumRetries().GetValue() < 1 {
			t.Error("a route without retries never reaches kvroute's fallback endpoints")
		}
	}
	fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()
	for _, ns := range []string{d.MetadataNamespace, d.SubsetHintNamespace} {
		if !slices.Contains(fwd, ns) {
			t.Errorf("ext_proc does not forward metadata namespace %s (forwarding_namespaces %v)", ns, fwd)
		}
	}
	for _, h := range []string{d.DestinationHeader, d.DestinationHeader + "-served", config.Default().Admission.TenantHeader} {
		if !slices.Contains(stripped, h) {
			t.Errorf("the client's %s is not stripped before ext_proc", h)
		}
	}
}
