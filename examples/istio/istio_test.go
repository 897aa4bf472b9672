// Package istio tests the Istio example: the EnvoyFilter's structure and every Envoy
// proto embedded in its patches, validated with the same code as envoy/*.yaml.
package istio

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy"
)

// envoyFilter is the subset of networking.istio.io/v1alpha3 EnvoyFilter this example
// uses; decoding is strict, so a misspelt field fails.
type envoyFilter struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		WorkloadSelector struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"workloadSelector"`
		ConfigPatches []configPatch `yaml:"configPatches"`
	} `yaml:"spec"`
}

type configPatch struct {
	ApplyTo string `yaml:"applyTo"`
	Match   struct {
		Context  string `yaml:"context"`
		Listener *struct {
			FilterChain struct {
				Filter struct {
					Name      string `yaml:"name"`
					SubFilter struct {
						Name string `yaml:"name"`
					} `yaml:"subFilter"`
				} `yaml:"filter"`
			} `yaml:"filterChain"`
		} `yaml:"listener"`
		RouteConfiguration *struct {
			Vhost struct {
				Route struct {
					Name string `yaml:"name"`
				} `yaml:"route"`
			} `yaml:"vhost"`
		} `yaml:"routeConfiguration"`
	} `yaml:"match"`
	Patch struct {
		Operation string    `yaml:"operation"`
		Value     yaml.Node `yaml:"value"`
	} `yaml:"patch"`
}

func decodeStrict(t *testing.T, text []byte, v any) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatal(err)
	}
}

// Patches are the Envoy protos an EnvoyFilter contributes.
type patches struct {
	network  []*listenerv3.Filter // MERGE fragments into the http_connection_manager
	filters  []*hcmv3.HttpFilter
	clusters []*clusterv3.Cluster
	routes   []*routev3.Route // MERGE fragments
}

func (p patches) messages() []proto.Message {
	var out []proto.Message
	for _, f := range p.network {
		out = append(out, f)
	}
	for _, f := range p.filters {
		out = append(out, f)
	}
	for _, c := range p.clusters {
		out = append(out, c)
	}
	for _, r := range p.routes {
		out = append(out, r)
	}
	return out
}

// extract decodes every patch value strictly as the Envoy type its applyTo names and
// validates complete values deeply (MERGE fragments are partial by design, so only
// their Any payloads are validated).
func extract(f *envoyFilter) (patches, error) {
	var p patches
	for i, cp := range f.Spec.ConfigPatches {
		raw, err := yaml.Marshal(&cp.Patch.Value)
		if err != nil {
			return p, err
		}
		var m proto.Message
		switch cp.ApplyTo {
		case "NETWORK_FILTER":
			x := &listenerv3.Filter{}
			p.network, m = append(p.network, x), x
		case "HTTP_FILTER":
			x := &hcmv3.HttpFilter{}
			p.filters, m = append(p.filters, x), x
		case "CLUSTER":
			x := &clusterv3.Cluster{}
			p.clusters, m = append(p.clusters, x), x
		case "HTTP_ROUTE":
			x := &routev3.Route{}
			p.routes, m = append(p.routes, x), x
		default:
			return p, errors.New("unsupported applyTo " + cp.ApplyTo)
		}
		if err := envoy.Unmarshal(raw, m); err != nil {
			return p, err
		}
		if cp.Patch.Operation == "MERGE" {
			err = envoy.Walk(m, func(x proto.Message, packed bool) error {
				if _, frag := x.(*hcmv3.HttpConnectionManager); frag {
					return nil // itself a fragment merged into Istio's own
				}
				if v, ok := x.(interface{ ValidateAll() error }); ok && packed && x != m {
					return v.ValidateAll()
				}
				return nil
			})
		} else {
			err = envoy.ValidateDeep(m)
		}
		if err != nil {
			return p, errors.New("patch " + strconv.Itoa(i+1) + ": " + err.Error())
		}
	}
	return p, nil
}

func load(t *testing.T, text []byte) *envoyFilter {
	t.Helper()
	var f envoyFilter
	decodeStrict(t, text, &f)
	return &f
}

func expect() envoy.Expect {
	d := config.Default()
	return envoy.Expect{DestinationHeader: d.ExtProc.DestinationHeader, MetadataNamespace: d.ExtProc.MetadataNamespace}
}

// checkFilter runs every check on an EnvoyFilter: the Envoy protos (envoy.Check) and the
// Istio structure around them.
func checkFilter(f *envoyFilter) error {
	var errs []error
	if f.APIVersion != "networking.istio.io/v1alpha3" || f.Kind != "EnvoyFilter" {
		errs = append(errs, errors.New("not a networking.istio.io/v1alpha3 EnvoyFilter"))
	}
	if len(f.Spec.WorkloadSelector.Labels) == 0 {
		errs = append(errs, errors.New("workloadSelector must pick the gateway (or workload): without it the filter patches every proxy in the namespace"))
	}
	p, err := extract(f)
	if err != nil {
		return err
	}
	if err := envoy.Check(expect(), p.messages()...); err != nil {
		errs = append(errs, err)
	}
	for i, cp := range f.Spec.ConfigPatches {
		where := "patch " + strconv.Itoa(i+1) + " (" + cp.ApplyTo + ")"
		if cp.Match.Context != "GATEWAY" {
			errs = append(errs, errors.New(where+": match.context must be GATEWAY for an ingress gateway"))
		}
		switch cp.ApplyTo {
		case "HTTP_FILTER":
			l := cp.Match.Listener
			ok := l != nil && l.FilterChain.Filter.Name == "envoy.filters.network.http_connection_manager" &&
				cp.Patch.Operation == "INSERT_BEFORE" && l.FilterChain.Filter.SubFilter.Name == envoy.RouterFilter
			if !ok {
				errs = append(errs, errors.New(where+": ext_proc must be inserted INSERT_BEFORE the router sub-filter of the http_connection_manager"))
			}
		case "NETWORK_FILTER":
			l := cp.Match.Listener
			if l == nil || l.FilterChain.Filter.Name != "envoy.filters.network.http_connection_manager" || cp.Patch.Operation != "MERGE" {
				errs = append(errs, errors.New(where+": the header strip MERGEs into the http_connection_manager"))
			}
		case "CLUSTER":
			if cp.Patch.Operation != "ADD" {
				errs = append(errs, errors.New(where+": clusters are ADDed"))
			}
		case "HTTP_ROUTE":
			if cp.Patch.Operation != "MERGE" || cp.Match.RouteConfiguration == nil || cp.Match.RouteConfiguration.Vhost.Route.Name == "" {
				errs = append(errs, errors.New(where+": the route patch MERGEs into a named route"))
			}
		}
	}
	return errors.Join(errs...)
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnvoyFilterIsValid(t *testing.T) {
	f := load(t, read(t, "envoyfilter.yaml"))
	if err := checkFilter(f); err != nil {
		t.Fatalf("the EnvoyFilter is broken:\n%v", err)
	}
	p, _ := extract(f)
	if len(p.network) != 1 || len(p.filters) != 1 || len(p.clusters) != 2 || len(p.routes) != 1 {
		t.Fatalf("want 1 HCM merge, 1 filter, 2 clusters, 1 route patch; got %d, %d, %d, %d", len(p.network), len(p.filters), len(p.clusters), len(p.routes))
	}
}

func TestEnvoyFilterBrokenCopies(t *testing.T) {
	good := string(read(t, "envoyfilter.yaml"))
	for _, tc := range []struct{ name, old, new string }{
		{"after the router", "operation: INSERT_BEFORE", "operation: INSERT_AFTER"},
		{"wrong header", "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-destination"},
		{"dangling ext_proc cluster", "cluster_name: kvroute-ext-proc", "cluster_name: kvroute"},
		{"typo inside typed_config", "message_timeout: 2s", "message_timout: 2s"},
		{"ext_proc cluster over HTTP/1", "http2_protocol_options: {}", "http_protocol_options: {}"},
		{"route to unknown cluster", "cluster: kvroute-workers", "cluster: workers"},
		{"no workload selector", "istio: ingressgateway\n  configPatches", "{}\n  configPatches"},
		{"sidecar context", "context: GATEWAY\n        listener", "context: SIDECAR_INBOUND\n        listener"},
		{"invalid nested value", "timeout: 1s\n              interval: 5s", "timeout: 1s\n              interval: 0s"},
		{"client destination header kept", "- remove: x-gateway-destination-endpoint\n", "- remove: x-other\n"},
		{"client served header kept", "- remove: x-gateway-destination-endpoint-served", "- remove: x-other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("mutation target %q not found", tc.old)
			}
			var f envoyFilter
			dec := yaml.NewDecoder(strings.NewReader(strings.Replace(good, tc.old, tc.new, 1)))
			dec.KnownFields(true)
			if err := dec.Decode(&f); err != nil {
				t.Fatalf("the copy should decode as an EnvoyFilter (only the checks can see the mistake): %v", err)
			}
			err := checkFilter(&f)
			if err == nil {
				t.Fatal("this broken copy must fail the checks")
			}
			t.Logf("caught: %v", err)
		})
	}
}

// The gateway, route name and kvroute address must agree with the EnvoyFilter and the
// Kubernetes example.
func TestGatewayAndServiceAgree(t *testing.T) {
	f := load(t, read(t, "envoyfilter.yaml"))
	var routeName string
	for _, cp := range f.Spec.ConfigPatches {
		if cp.Match.RouteConfiguration != nil {
			routeName = cp.Match.RouteConfiguration.Vhost.Route.Name
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(read(t, "gateway.yaml")))
	var gwSelector map[string]string
	var vsRoutes []string
	var vsGateways []string
	gwName := ""
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name, Namespace string
			} `yaml:"metadata"`
			Spec struct {
				Selector map[string]string `yaml:"selector"`
				Gateways []string          `yaml:"gateways"`
				HTTP     []struct {
					Name string `yaml:"name"`
				} `yaml:"http"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		switch doc.Kind {
		case "Gateway":
			gwSelector, gwName = doc.Spec.Selector, doc.Metadata.Name
		case "VirtualService":
			vsGateways = doc.Spec.Gateways
			for _, h := range doc.Spec.HTTP {
				vsRoutes = append(vsRoutes, h.Name)
			}
		}
	}
	for k, v := range f.Spec.WorkloadSelector.Labels {
		if gwSelector[k] != v {
			t.Errorf("the EnvoyFilter selects %s=%s, the Gateway runs on %v", k, v, gwSelector)
		}
	}
	if !strings.Contains(strings.Join(vsGateways, ","), gwName) || gwName == "" {
		t.Errorf("the VirtualService must be bound to gateway %q, has %v", gwName, vsGateways)
	}
	if routeName == "" || !strings.Contains(","+strings.Join(vsRoutes, ",")+",", ","+routeName+",") {
		t.Errorf("the EnvoyFilter patches route %q, the VirtualService names %v", routeName, vsRoutes)
	}

	// kvroute's address: the Service of examples/kubernetes, its ext_proc and health ports.
	p, err := extract(f)
	if err != nil {
		t.Fatal(err)
	}
	d := config.Default()
	for _, c := range p.clusters {
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if sa.GetAddress() != "kvroute.llm.svc.cluster.local" {
					t.Errorf("cluster %s dials %s; the Kubernetes example's Service is kvroute in namespace llm", c.GetName(), sa.GetAddress())
				}
				if _, pt, _ := net.SplitHostPort(d.Server.ExtProcAddr); strconv.Itoa(int(sa.GetPortValue())) != pt {
					t.Errorf("cluster %s dials port %d, kvroute serves ext_proc on %s", c.GetName(), sa.GetPortValue(), d.Server.ExtProcAddr)
				}
				if _, pt, _ := net.SplitHostPort(d.Server.HealthAddr); strconv.Itoa(int(lb.GetEndpoint().GetHealthCheckConfig().GetPortValue())) != pt {
					t.Errorf("cluster %s health-checks port %d, kvroute serves health on %s", c.GetName(), lb.GetEndpoint().GetHealthCheckConfig().GetPortValue(), d.Server.HealthAddr)
				}
			}
		}
	}
	k8s := string(read(t, "../kubernetes/kvroute.yaml"))
	for _, want := range []string{"name: kvroute\n  namespace: llm", "port: 9002", "port: 9003"} {
		if !strings.Contains(k8s, want) {
			t.Errorf("examples/kubernetes/kvroute.yaml no longer has %q", want)
		}
	}
}

// Issue 10 item 4: the route to the ORIGINAL_DST cluster is taken only when kvroute set
// the destination header, and a fallback route to the load-balanced Service follows it.
func TestFailOpenFallsBackToTheService(t *testing.T) {
	dec := yaml.NewDecoder(bytes.NewReader(read(t, "gateway.yaml")))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				HTTP []struct {
					Name  string `yaml:"name"`
					Match []struct {
						Headers map[string]map[string]string `yaml:"headers"`
					} `yaml:"match"`
					Route []struct {
						Destination struct {
							Host string `yaml:"host"`
						} `yaml:"destination"`
					} `yaml:"route"`
				} `yaml:"http"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatal("no VirtualService in gateway.yaml")
		}
		if doc.Kind != "VirtualService" {
			continue
		}
		h := doc.Spec.HTTP
		if len(h) != 2 || h[0].Name != "kvroute-routed" || h[1].Name != "kvroute-llm" {
			t.Fatalf("want routes kvroute-routed then kvroute-llm, got %+v", h)
		}
		if len(h[0].Match) == 0 || h[0].Match[0].Headers[config.Default().ExtProc.DestinationHeader]["regex"] != ".+" {
			t.Errorf("kvroute-routed must match only when %s is present", config.Default().ExtProc.DestinationHeader)
		}
		for _, m := range h[1].Match {
			if len(m.Headers) != 0 {
				t.Errorf("the fallback route must not depend on headers")
			}
		}
		if len(h[1].Route) != 1 || h[1].Route[0].Destination.Host != "vllm.llm.svc.cluster.local" {
			t.Errorf("the fallback goes to the vLLM Service, got %+v", h[1].Route)
		}
		return
	}
}
