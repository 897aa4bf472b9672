package kubernetes

import (
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Several kvroute replicas: peers discovered through a headless Service over the
// kvroute pods at the port kvroute listens on, and a PodDisruptionBudget that keeps a
// majority of them through voluntary disruptions.
func TestReplicasPeersAndDisruptionBudget(t *testing.T) {
	o := load(t)
	cfg := kvrouteConfig(t, o)
	d := o.deployments["kvroute"]
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Fatalf("kvroute runs %v replicas, want ≥ 2", d.Spec.Replicas)
	}
	if !cfg.Peers.Enabled() || cfg.Peers.Discovery != "kubernetes" {
		t.Fatalf("peers: %+v, want listen_addr and discovery kubernetes", cfg.Peers)
	}
	// The peers port listens on every interface: peers must authenticate, with the
	// token file mounted from a Secret (config.Load already refused the file otherwise).
	if !cfg.Peers.Authenticated() || cfg.Peers.Insecure {
		t.Fatalf("peers listen on %q without authentication (token %v, insecure %v)", cfg.Peers.ListenAddr, cfg.Peers.TokenFile != "", cfg.Peers.Insecure)
	}
	if tf := cfg.Peers.TokenFile; tf != "" {
		c := d.Spec.Template.Spec.Containers[0]
		var vol string
		for _, m := range c.VolumeMounts {
			if filepath.Dir(tf) == filepath.Clean(m.MountPath) {
				vol = m.Name
			}
		}
		i := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol })
		if i < 0 || d.Spec.Template.Spec.Volumes[i].Secret == nil {
			t.Fatalf("peers.token_file %s is not in a mounted Secret volume", tf)
		}
		sv := d.Spec.Template.Spec.Volumes[i].Secret
		if !slices.ContainsFunc(sv.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(tf) }) {
			t.Errorf("Secret %s mounts no %s", sv.SecretName, filepath.Base(tf))
		}
	}
	if cfg.Index.BindEndpoint != "" {
		t.Error("index.bind_endpoint with several replicas: only one would receive KV events")
	}
	byName, numbers := containerPorts(d)
	listen := portOf(t, cfg.Peers.ListenAddr)
	if !slices.Contains(numbers, listen) {
		t.Errorf("peers listen on %d, not a declared container port", listen)
	}
	svc := o.services[cfg.Peers.Kubernetes.Service]
	if svc == nil {
		t.Fatalf("peers.kubernetes.service %s is not a Service", cfg.Peers.Kubernetes.Service)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("peers Service %s should be headless: peers dial pod IPs", svc.Name)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("peers Service %s does not select the kvroute pods", svc.Name)
	}
	found := false
	for _, p := range svc.Spec.Ports {
		if p.Name == cfg.Peers.Kubernetes.PortName {
			found = true
			if p.TargetPort.StrVal != "" && byName[p.TargetPort.StrVal] != listen || p.TargetPort.StrVal == "" && p.TargetPort.IntVal != listen {
				t.Errorf("peers Service port %s targets %s, kvroute's peers listen on %d", p.Name, p.TargetPort.String(), listen)
			}
		}
	}
	if !found {
		t.Errorf("peers Service %s has no port named %s (EndpointSlices copy the Service's port names)", svc.Name, cfg.Peers.Kubernetes.PortName)
	}
	// Envoy's ext_proc cluster (STRICT_DNS, checked by envoy.Check) resolves the kvroute
	// Service: headless, it yields one host per replica.
	if ext := o.services["kvroute"]; ext == nil || ext.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Error("the kvroute Service Envoy's ext_proc cluster resolves must be headless (clusterIP: None): a ClusterIP is one host for every replica")
	}
	var pdbOK bool
	for _, p := range o.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() < 1 || p.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
			t.Errorf("PodDisruptionBudget %s minAvailable %v: want 1..replicas-1 (%d)", p.Name, p.Spec.MinAvailable, *d.Spec.Replicas-1)
		}
		pdbOK = true
	}
	if !pdbOK {
		t.Error("no PodDisruptionBudget selects the kvroute pods")
	}
}
