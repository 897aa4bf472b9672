// Package kubernetes tests the Kubernetes manifests: each document decodes strictly
// into the Kubernetes API types, and the objects agree with each other (selectors,
// ports, ConfigMaps, RBAC) and with kvroute's and Envoy's configuration.
package kubernetes

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy"
)

const namespace = "llm"

// externalConfigMaps are created by a documented kubectl command rather than a manifest.
var externalConfigMaps = map[string]string{"envoy": "kubectl -n llm create configmap envoy --from-file=envoy.yaml=envoy/envoy-buffered.yaml"}

type objects struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	accounts    map[string]*corev1.ServiceAccount
	roles       map[string]*rbacv1.Role
	bindings    []*rbacv1.RoleBinding
	pdbs        []*policyv1.PodDisruptionBudget
	all         []runtime.Object
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decodeStrict decodes every manifest with the client-go scheme in strict mode
// (unknown and duplicate fields are errors, as with kubectl --validate=strict).
func decodeStrict(t *testing.T, text []byte, file string) []runtime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var out []runtime.Object
	for i, doc := range docSep.Split(string(text), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		obj, _, err := dec.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Errorf("%s document %d: %v", file, i+1, err)
			continue
		}
		out = append(out, obj)
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func load(t *testing.T) objects {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	o := objects{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, accounts: map[string]*corev1.ServiceAccount{}, roles: map[string]*rbacv1.Role{}}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range decodeStrict(t, text, f) {
			o.all = append(o.all, obj)
			switch x := obj.(type) {
			case *appsv1.Deployment:
				o.deployments[x.Name] = x
			case *corev1.Service:
				o.services[x.Name] = x
			case *corev1.ConfigMap:
				o.configMaps[x.Name] = x
			case *corev1.ServiceAccount:
				o.accounts[x.Name] = x
			case *rbacv1.Role:
				o.roles[x.Name] = x
			case *rbacv1.RoleBinding:
				o.bindings = append(o.bindings, x)
			case *policyv1.PodDisruptionBudget:
				o.pdbs = append(o.pdbs, x)
			case *corev1.Namespace:
			default:
				t.Errorf("unexpected kind %T", obj)
			}
		}
	}
	return o
}

func TestStrictDecodingRejectsTypos(t *testing.T) {
	bad := []byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  selectr: {a: b}\n")
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	if _, _, err := dec.Decode(bad, nil, nil); err == nil {
		t.Fatal("strict decoding must reject unknown fields")
	}
}

func TestManifestsDecodeAndNamespaces(t *testing.T) {
	o := load(t)
	for _, name := range []string{"kvroute", "vllm", "envoy"} {
		if o.deployments[name] == nil || o.services[name] == nil {
			t.Errorf("need a Deployment and a Service named %s", name)
		}
	}
	for _, obj := range o.all {
		m, err := metaOf(obj)
		if err != nil {
			t.Fatal(err)
		}
		if _, ns := obj.(*corev1.Namespace); ns {
			if m.GetName() != namespace {
				t.Errorf("namespace %s, want %s", m.GetName(), namespace)
			}
			continue
		}
		if m.GetNamespace() != namespace {
			t.Errorf("%T %s: namespace %q, want %q", obj, m.GetName(), m.GetNamespace(), namespace)
		}
	}
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	type hasMeta interface{ GetObjectMeta() metav1.Object }
	if h, ok := obj.(hasMeta); ok {
		return h.GetObjectMeta(), nil
	}
	return nil, os.ErrInvalid
}

// containerPorts maps port names and numbers of a deployment's containers.
func containerPorts(d *appsv1.Deployment) (byName map[string]int32, numbers []int32) {
	byName = map[string]int32{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name != "" {
				byName[p.Name] = p.ContainerPort
			}
			numbers = append(numbers, p.ContainerPort)
		}
	}
	return byName, numbers
}

func TestSelectorsPortsAndVolumes(t *testing.T) {
	o := load(t)
	for name, d := range o.deployments {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			t.Fatalf("deployment %s: %v", name, err)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("deployment %s: selector %s does not match its pod labels %v", name, sel, d.Spec.Template.Labels)
		}
		byName, numbers := containerPorts(d)
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap == nil {
				continue
			}
			cm, ok := o.configMaps[v.ConfigMap.Name]
			if !ok {
				if _, ext := externalConfigMaps[v.ConfigMap.Name]; !ext {
					t.Errorf("deployment %s mounts ConfigMap %s, which is not defined", name, v.ConfigMap.Name)
				}
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					t.Errorf("deployment %s mounts key %s of ConfigMap %s, which has no such key", name, it.Key, cm.Name)
				}
			}
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if p == nil || p.HTTPGet == nil {
					continue
				}
				if pn := p.HTTPGet.Port.StrVal; pn != "" {
					if _, ok := byName[pn]; !ok {
						t.Errorf("deployment %s: probe port %q is not a container port", name, pn)
					}
				}
			}
		}
		if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "" && o.accounts[sa] == nil {
			t.Errorf("deployment %s uses ServiceAccount %s, which is not defined", name, sa)
		}
		if d.Spec.Template.Annotations["prometheus.io/scrape"] == "true" {
			p, err := strconv.Atoi(d.Spec.Template.Annotations["prometheus.io/port"])
			if err != nil || !slices.Contains(numbers, int32(p)) {
				t.Errorf("deployment %s: prometheus.io/port %q is not a container port %v", name, d.Spec.Template.Annotations["prometheus.io/port"], numbers)
			}
			if d.Spec.Template.Annotations["prometheus.io/path"] == "" {
				t.Errorf("deployment %s: prometheus.io/path is missing", name)
			}
		}
	}
	for name, s := range o.services {
		var matched []*appsv1.Deployment
		for _, d := range o.deployments {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				matched = append(matched, d)
			}
		}
		if len(s.Spec.Selector) == 0 || len(matched) != 1 {
			t.Errorf("service %s selects %d deployments, want exactly 1", name, len(matched))
			continue
		}
		byName, numbers := containerPorts(matched[0])
		for _, p := range s.Spec.Ports {
			tp := p.TargetPort
			switch {
			case tp.StrVal != "":
				if _, ok := byName[tp.StrVal]; !ok {
					t.Errorf("service %s port %s targets %q, not a container port name of %s", name, p.Name, tp.StrVal, matched[0].Name)
				}
			case !slices.Contains(numbers, p.Port) && tp.IntVal == 0:
				t.Errorf("service %s port %d is not a container port of %s", name, p.Port, matched[0].Name)
			}
		}
	}
}

func TestRBACAllowsEndpointSliceWatch(t *testing.T) {
	o := load(t)
	sa := o.deployments["kvroute"].Spec.Template.Spec.ServiceAccountName
	granted := map[string]bool{}
	for _, b := range o.bindings {
		bound := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
		})
		if !bound || b.RoleRef.Kind != "Role" {
			continue
		}
		r, ok := o.roles[b.RoleRef.Name]
		if !ok {
			t.Errorf("RoleBinding %s refers to undefined Role %s", b.Name, b.RoleRef.Name)
			continue
		}
		for _, rule := range r.Rules {
			if slices.Contains(rule.APIGroups, "discovery.k8s.io") && slices.Contains(rule.Resources, "endpointslices") {
				for _, v := range rule.Verbs {
					granted[v] = true
				}
			}
		}
	}
	for _, v := range []string{"list", "watch"} {
		if !granted[v] {
			t.Errorf("ServiceAccount %s needs %s on discovery.k8s.io/endpointslices for the informer", sa, v)
		}
	}
}

func kvrouteConfig(t *testing.T, o objects) *config.Config {
	t.Helper()
	cm := o.configMaps["kvroute"]
	if cm == nil {
		t.Fatal("no kvroute ConfigMap")
	}
	d := o.deployments["kvroute"]
	c := d.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatal("kvroute's args must name --config")
	}
	dir, file := filepath.Split(c.Args[i+1])
	mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == filepath.Clean(dir) })
	if !mounted {
		t.Fatalf("--config %s is not under a mounted volume", c.Args[i+1])
	}
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, []byte(cm.Data[file]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(nil, func(k string) (string, bool) {
		if k == config.EnvPrefix+"_CONFIG" {
			return path, true
		}
		return "", false
	})
	if err != nil {
		t.Fatalf("kvroute would refuse its ConfigMap: %v", err)
	}
	return cfg
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

func TestKVRouteConfigMatchesManifests(t *testing.T) {
	o := load(t)
	cfg := kvrouteConfig(t, o)
	if cfg.Discovery.Mode != "kubernetes" {
		t.Fatalf("discovery.mode = %s, want kubernetes", cfg.Discovery.Mode)
	}
	_, kvNumbers := containerPorts(o.deployments["kvroute"])
	for _, a := range []string{cfg.Server.ExtProcAddr, cfg.Server.HealthAddr, cfg.Server.AdminAddr} {
		if !slices.Contains(kvNumbers, portOf(t, a)) {
			t.Errorf("kvroute listens on %s but the container does not declare that port", a)
		}
	}
	svc := o.services[cfg.Discovery.Kubernetes.Service]
	if svc == nil {
		t.Fatalf("discovery.kubernetes.service %s is not a Service", cfg.Discovery.Kubernetes.Service)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("service %s should be headless (clusterIP: None): Envoy connects to pod IPs", svc.Name)
	}
	names := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		names[p.Name] = p.Port
	}
	for _, n := range []string{cfg.Discovery.Kubernetes.HTTPPortName, cfg.Discovery.Kubernetes.KVEventsPortName} {
		if _, ok := names[n]; !ok {
			t.Errorf("service %s has no port named %s (EndpointSlices copy the Service's port names)", svc.Name, n)
		}
	}

	// vLLM's own flags must agree with the ports and with kvroute's templates.
	vd := o.deployments["vllm"]
	byName, _ := containerPorts(vd)
	args := vd.Spec.Template.Spec.Containers[0].Args
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		t.Fatalf("vllm args lack %s", name)
		return ""
	}
	if p, _ := strconv.Atoi(flag("--port")); int32(p) != byName[cfg.Discovery.Kubernetes.HTTPPortName] {
		t.Errorf("vllm --port %d, port %s is %d", p, cfg.Discovery.Kubernetes.HTTPPortName, byName[cfg.Discovery.Kubernetes.HTTPPortName])
	}
	var kv struct {
		Enable         bool   `json:"enable_kv_cache_events"`
		Publisher      string `json:"publisher"`
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
		Topic          string `json:"topic"`
	}
	dec := json.NewDecoder(strings.NewReader(flag("--kv-events-config")))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kv); err != nil {
		t.Fatalf("--kv-events-config: %v", err)
	}
	if !kv.Enable || kv.Publisher != "zmq" {
		t.Errorf("--kv-events-config must enable the zmq publisher: %+v", kv)
	}
	if portOf(t, strings.TrimPrefix(kv.Endpoint, "tcp://")) != byName[cfg.Discovery.Kubernetes.KVEventsPortName] {
		t.Errorf("vLLM publishes on %s, but port %s is %d", kv.Endpoint, cfg.Discovery.Kubernetes.KVEventsPortName, byName[cfg.Discovery.Kubernetes.KVEventsPortName])
	}
	replayTmpl := strings.ReplaceAll(strings.TrimPrefix(cfg.Discovery.KVEventsReplayEndpoint, "tcp://"), "{ip}", "0.0.0.0")
	if portOf(t, strings.TrimPrefix(kv.ReplayEndpoint, "tcp://")) != portOf(t, replayTmpl) {
		t.Errorf("vLLM replays on %s, kvroute dials %s", kv.ReplayEndpoint, cfg.Discovery.KVEventsReplayEndpoint)
	}
	if !strings.Contains(cfg.Discovery.KVEventsEndpoint, "{port}") && !strings.Contains(cfg.Discovery.KVEventsEndpoint, strconv.Itoa(int(byName[cfg.Discovery.Kubernetes.KVEventsPortName]))) {
		t.Errorf("kv_events_endpoint %s names neither {port} nor the kv events port", cfg.Discovery.KVEventsEndpoint)
	}
	if !slices.ContainsFunc(cfg.Models, func(m config.Model) bool { return m.Name == flag("--model") }) {
		t.Errorf("vllm serves %s, which kvroute's models do not list", flag("--model"))
	}
	if bs, _ := strconv.Atoi(flag("--block-size")); len(cfg.Models) > 0 && cfg.Models[0].BlockSize != bs {
		t.Errorf("vllm --block-size %d, kvroute models[0].block_size %d: block keys would never match", bs, cfg.Models[0].BlockSize)
	}
}

func TestEnvoyReachesKVRouteService(t *testing.T) {
	o := load(t)
	cfg := kvrouteConfig(t, o)
	if cmd := externalConfigMaps["envoy"]; !strings.Contains(readFile(t, "envoy.yaml"), cmd) || !strings.Contains(readFile(t, "README.md"), cmd) {
		t.Errorf("the command creating the envoy ConfigMap (%s) must be documented in envoy.yaml and README.md", cmd)
	}
	b, err := envoy.LoadBootstrap("../../envoy/envoy-buffered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := envoy.Check(envoy.Expect{DestinationHeader: cfg.ExtProc.DestinationHeader, MetadataNamespace: cfg.ExtProc.MetadataNamespace}, b); err != nil {
		t.Fatal(err)
	}
	svc := o.services["kvroute"]
	ports := map[int32]bool{}
	for _, p := range svc.Spec.Ports {
		ports[p.Port] = true
	}
	found := false
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if sa.GetAddress() != svc.Name {
					continue
				}
				found = true
				if p := int32(sa.GetPortValue()); !ports[p] || p != portOf(t, cfg.Server.ExtProcAddr) {
					t.Errorf("envoy dials %s:%d; the Service has %v and kvroute serves ext_proc on %s", svc.Name, p, ports, cfg.Server.ExtProcAddr)
				}
				if p := int32(lb.GetEndpoint().GetHealthCheckConfig().GetPortValue()); !ports[p] || p != portOf(t, cfg.Server.HealthAddr) {
					t.Errorf("envoy health-checks port %d; the Service has %v and kvroute serves health on %s", p, ports, cfg.Server.HealthAddr)
				}
			}
		}
	}
	if !found {
		t.Errorf("no Envoy cluster endpoint names the %s Service", svc.Name)
	}
	ed := o.deployments["envoy"]
	byName, _ := containerPorts(ed)
	for _, l := range b.GetStaticResources().GetListeners() {
		if p := int32(l.GetAddress().GetSocketAddress().GetPortValue()); byName["http"] != p {
			t.Errorf("envoy listens on %d, its container port http is %d", p, byName["http"])
		}
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The admin port is bound on every interface (Prometheus, the kubelet probes), so
// /debug/* must need server.admin_token: the container takes KVROUTE_SERVER_ADMIN_TOKEN
// from a Secret (not optional, so the pod does not start without it), never a literal
// in the ConfigMap or the manifest.
func TestAdminNeedsTokenWhenBoundWide(t *testing.T) {
	o := load(t)
	cfg := kvrouteConfig(t, o)
	host, _, err := net.SplitHostPort(cfg.Server.AdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return
	}
	if cfg.Server.AdminToken != "" {
		t.Fatal("server.admin_token is a literal in the ConfigMap: take it from a Secret")
	}
	c := o.deployments["kvroute"].Spec.Template.Spec.Containers[0]
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == config.EnvPrefix+"_SERVER_ADMIN_TOKEN" })
	if i < 0 {
		t.Fatalf("admin on %s without %s_SERVER_ADMIN_TOKEN", cfg.Server.AdminAddr, config.EnvPrefix)
	}
	e := c.Env[i]
	var ref *corev1.SecretKeySelector
	if e.ValueFrom != nil {
		ref = e.ValueFrom.SecretKeyRef
	}
	if e.Value != "" || ref == nil || ref.Name == "" || ref.Key == "" || (ref.Optional != nil && *ref.Optional) {
		t.Fatalf("%s must come from a required Secret key, got %+v", e.Name, e)
	}
}
