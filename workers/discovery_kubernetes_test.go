package workers

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/metrics"
)

func ptr[T any](v T) *T { return &v }

type ep struct {
	pod, ip     string
	ready, term *bool
}

func slice(name, service string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(8000))},
			{Name: ptr("kv-events"), Port: ptr(int32(5557))},
		},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Terminating: e.term},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: e.pod, Namespace: "llm"}})
	}
	return s
}

// startKubernetes runs discovery against a fake clientset and returns once the
// informer's watch is established, so that later changes are not lost between the
// fake's list and watch (the fake ignores resourceVersion).
func startKubernetes(t *testing.T, k *Kubernetes, objs ...runtime.Object) (*fake.Clientset, *watcher, func() error) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	watching := make(chan struct{})
	cs.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
		close(watching)
		return true, w, err
	})
	k.Client = cs
	w := newWatcher(k.Registry)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("informer never started watching")
	}
	return cs, w, func() error { cancel(); return <-done }
}

func TestKubernetesDiscoveryFollowsEndpointSlices(t *testing.T) {
	reg := NewRegistry()
	m := metrics.New(prometheus.NewRegistry()).Workers
	k := &Kubernetes{Registry: reg, Namespace: "llm", Service: "vllm", HTTPPortName: "http", KVPortName: "kv-events",
		Template: Template{KVEventsEndpoint: "tcp://{ip}:{port}", Models: []string{"qwen"}}, Metrics: m}
	cs, w, stop := startKubernetes(t, k,
		slice("vllm-a", "vllm", ep{pod: "vllm-0", ip: "10.1.0.1"}, ep{pod: "vllm-1", ip: "10.1.0.2", ready: ptr(false)}),
		slice("other-a", "other", ep{pod: "other-0", ip: "10.2.0.1"}))
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.1:8000 tcp://10.1.0.1:5557"})
	if got := reg.All()[0].Models; len(got) != 1 || got[0] != "qwen" {
		t.Fatalf("discovered workers serve the template's models, got %v", got)
	}

	ctx := t.Context()
	sl := cs.DiscoveryV1().EndpointSlices("llm")
	// The not-ready pod becomes ready: it joins.
	upd := slice("vllm-a", "vllm", ep{pod: "vllm-0", ip: "10.1.0.1"}, ep{pod: "vllm-1", ip: "10.1.0.2", ready: ptr(true)})
	if _, err := sl.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.1:8000 tcp://10.1.0.1:5557", "vllm-1=10.1.0.2:8000 tcp://10.1.0.2:5557"})

	// A second slice of the same Service adds a worker; a pod listed twice is one worker.
	if _, err := sl.Create(ctx, slice("vllm-b", "vllm", ep{pod: "vllm-2", ip: "10.1.0.3"}, ep{pod: "vllm-0", ip: "10.1.0.1"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.1:8000 tcp://10.1.0.1:5557", "vllm-1=10.1.0.2:8000 tcp://10.1.0.2:5557", "vllm-2=10.1.0.3:8000 tcp://10.1.0.3:5557"})

	// A terminating pod leaves at once, before its endpoint is deleted.
	upd = slice("vllm-a", "vllm", ep{pod: "vllm-0", ip: "10.1.0.1"}, ep{pod: "vllm-1", ip: "10.1.0.2", term: ptr(true)})
	if _, err := sl.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.1:8000 tcp://10.1.0.1:5557", "vllm-2=10.1.0.3:8000 tcp://10.1.0.3:5557"})

	// Deleting a slice removes the workers only it listed.
	if err := sl.Delete(ctx, "vllm-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.1:8000 tcp://10.1.0.1:5557"})

	// A pod rescheduled under the same name with a new IP is replaced.
	if _, err := sl.Update(ctx, slice("vllm-a", "vllm", ep{pod: "vllm-0", ip: "10.1.0.9"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reg, w, []string{"vllm-0=10.1.0.9:8000 tcp://10.1.0.9:5557"})

	if err := stop(); err != nil {
		t.Fatalf("Run must return nil on cancel, got %v", err)
	}
	if n := testutil.ToFloat64(m.Discovered.WithLabelValues("kubernetes", "ready")); n != 1 {
		t.Fatalf("ready gauge = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.Refreshes.WithLabelValues("kubernetes")); n < 6 {
		t.Fatalf("refreshes = %v, want ≥ 6 (one per change)", n)
	}
}

func TestKubernetesDiscoverySkipsSlicesWithoutThePort(t *testing.T) {
	reg := NewRegistry()
	m := metrics.New(prometheus.NewRegistry()).Workers
	bad := slice("vllm-bad", "vllm", ep{pod: "vllm-9", ip: "10.1.0.9"})
	bad.Ports = []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9000))}}
	fqdn := slice("vllm-fqdn", "vllm", ep{pod: "vllm-8", ip: "vllm-8.example"})
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	static := &Worker{Name: "static", Address: "10.9.9.9:8000"}
	k := &Kubernetes{Registry: reg, Namespace: "llm", Service: "vllm", HTTPPortName: "http", Static: []*Worker{static}, Metrics: m}
	_, w, stop := startKubernetes(t, k, bad, fqdn, slice("vllm-a", "vllm", ep{pod: "vllm-0", ip: "10.1.0.1"}))
	waitFor(t, reg, w, []string{"static=10.9.9.9:8000 ", "vllm-0=10.1.0.1:8000 "})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(m.Errors.WithLabelValues("kubernetes", DiscoveryErrorNoPort)); n < 1 {
		t.Fatalf("a slice without the HTTP port must be counted, got %v", n)
	}
	if n := testutil.ToFloat64(m.Errors.WithLabelValues("kubernetes", DiscoveryErrorBadAddress)); n < 1 {
		t.Fatalf("an FQDN slice must be counted, got %v", n)
	}
}

func TestKubernetesSelector(t *testing.T) {
	k := &Kubernetes{Service: "vllm", LabelSelector: "app=vllm,tier in (gpu)"}
	sel, err := k.Selector()
	if err != nil {
		t.Fatal(err)
	}
	if got := sel.String(); got != "app=vllm,kubernetes.io/service-name=vllm,tier in (gpu)" {
		t.Fatalf("selector = %q", got)
	}
	if _, err := (&Kubernetes{LabelSelector: "a in ("}).Selector(); err == nil {
		t.Fatal("a malformed label_selector must be an error")
	}
	if err := (&Kubernetes{LabelSelector: "a in ("}).Run(t.Context()); err == nil {
		t.Fatal("Run must refuse a malformed label_selector")
	}
}

func TestKubernetesRunReturnsOnCancelBeforeSync(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	k := &Kubernetes{Registry: NewRegistry(), Client: cs, Service: "vllm"}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := k.Run(ctx); err != nil {
		t.Fatalf("cancelled before the cache synced: Run must return nil, got %v", err)
	}
}
