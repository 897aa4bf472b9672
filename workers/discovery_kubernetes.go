package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/metrics"
)

// ErrCacheSync is returned by Kubernetes.Run when the EndpointSlice cache never synced.
var ErrCacheSync = errors.New("kubernetes discovery: EndpointSlice cache did not sync")

// Kubernetes discovers workers from the EndpointSlices of a Service through a
// client-go informer: list once, then watch, so pods joining or leaving are applied
// within the watch latency. Only ready endpoints (conditions.ready unset or true,
// not terminating) are workers; each is named after its Pod (targetRef) or, without
// one, its address. kvroute needs list and watch on discovery.k8s.io/endpointslices.
type Kubernetes struct {
	Registry  *Registry
	Client    kubernetes.Interface
	Namespace string
	// Service selects slices labelled kubernetes.io/service-name=Service ("" = any);
	// LabelSelector is ANDed with it.
	Service       string
	LabelSelector string
	HTTPPortName  string // EndpointSlice port of the HTTP API ("" = the only port)
	KVPortName    string // port filling {port} in the template's KV endpoints ("" = none)
	Resync        time.Duration
	Template      Template
	Static        []*Worker
	// Union, when set, receives the discovered workers as this source's share (Source
	// names it: the source label of the discovery metrics, "" = "kubernetes") instead
	// of Registry and Static: several sources into one registry.
	Union   *Union
	Source  string
	Metrics *metrics.Workers
	Logger  *slog.Logger
	Now     func() time.Time // nil = time.Now
}

// InClusterClient returns a clientset using the pod's service account, and the pod's
// namespace ("" if unknown).
func InClusterClient() (kubernetes.Interface, string, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes discovery: %w", err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes discovery: %w", err)
	}
	return c, inClusterNamespace(), nil
}

// Selector is the label selector Run lists EndpointSlices with.
func (k *Kubernetes) Selector() (labels.Selector, error) {
	sel, err := labels.Parse(k.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: label_selector: %w", err)
	}
	if k.Service != "" {
		svc, err := labels.Parse(discoveryv1.LabelServiceName + "=" + k.Service)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: service: %w", err)
		}
		reqs, _ := svc.Requirements()
		sel = sel.Add(reqs...)
	}
	return sel, nil
}

// Run starts the informer, applies the first full snapshot once the cache synced, then
// one snapshot per burst of changes, until ctx is cancelled.
func (k *Kubernetes) Run(ctx context.Context) error {
	if k.Logger == nil {
		k.Logger = slog.Default()
	}
	if k.Now == nil {
		k.Now = time.Now
	}
	sel, err := k.Selector()
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(k.Client, k.Resync,
		informers.WithNamespace(k.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	inf := factory.Discovery().V1().EndpointSlices()
	// One-slot channel: a burst of slice events becomes one recomputation.
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	lister := inf.Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		countError(k.Metrics, k.source(), DiscoveryErrorLookup)
		return ErrCacheSync
	}
	for {
		slices, err := lister.EndpointSlices(k.Namespace).List(sel)
		if err != nil {
			countError(k.Metrics, k.source(), DiscoveryErrorLookup)
			k.Logger.Warn("kubernetes discovery: list failed; keeping the previous workers", "err", err)
		} else {
			found, ready, notReady := k.workers(slices)
			applySnapshot(k.Registry, k.Static, k.Union, found, k.Metrics, k.source(), k.Now(), ready, notReady)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// workers converts slices to workers: ready endpoints only, deduplicated by name
// (an endpoint can sit in two slices while they are rebalanced).
func (k *Kubernetes) workers(slices []*discoveryv1.EndpointSlice) (found []*Worker, ready, notReady int) {
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	seen := map[string]bool{}
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			countError(k.Metrics, k.source(), DiscoveryErrorBadAddress)
			continue
		}
		httpPort, ok := portNamed(s.Ports, k.HTTPPortName)
		if !ok {
			countError(k.Metrics, k.source(), DiscoveryErrorNoPort)
			k.Logger.Warn("kubernetes discovery: EndpointSlice has no such port", "slice", s.Name, "port", k.HTTPPortName)
			continue
		}
		kvPort := 0
		if k.KVPortName != "" {
			kvPort, _ = portNamed(s.Ports, k.KVPortName)
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			if !endpointReady(e.Conditions) {
				notReady++
				continue
			}
			ip := e.Addresses[0]
			if net.ParseIP(ip) == nil {
				countError(k.Metrics, k.source(), DiscoveryErrorBadAddress)
				continue
			}
			w := k.Template.worker("", ip, httpPort, kvPort)
			w.Name = w.Address
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.Name != "" {
				w.Name = e.TargetRef.Name
			}
			if seen[w.Name] {
				continue
			}
			seen[w.Name] = true
			ready++
			found = append(found, w)
		}
	}
	return found, ready, notReady
}

// portNamed returns the number of the port called name, or of the only port when name
// is "".
func portNamed(ps []discoveryv1.EndpointPort, name string) (int, bool) {
	if name == "" && len(ps) == 1 && ps[0].Port != nil {
		return int(*ps[0].Port), true
	}
	for _, p := range ps {
		if p.Name != nil && *p.Name == name && p.Port != nil {
			return int(*p.Port), true
		}
	}
	return 0, false
}

// endpointReady follows the EndpointConditions contract: ready unset means ready, and
// a terminating endpoint takes no new requests.
func endpointReady(c discoveryv1.EndpointConditions) bool {
	if c.Terminating != nil && *c.Terminating {
		return false
	}
	return c.Ready == nil || *c.Ready
}

func (k *Kubernetes) source() string {
	if k.Source != "" {
		return k.Source
	}
	return "kubernetes"
}
