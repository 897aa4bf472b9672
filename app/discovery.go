package app

import (
	"fmt"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/workers"
)

// newDiscovery builds the discovery source named by discovery.mode, or nil for
// "static", with the further discovery.sources beside it (all into one
// workers.Union). Discovered workers are added to the static ones.
func (a *App) newDiscovery() (workers.Source, error) {
	d := a.Config.Discovery
	static := staticWorkers(a.Config)
	var u *workers.Union
	if len(d.Sources) > 0 {
		u = &workers.Union{Registry: a.Registry, Static: static}
	}
	var all workers.Sources
	if d.Mode == "static" || d.Mode == "" {
		// The static set never changes: record it once so that dashboards of
		// kvroute_discovery_workers are not empty without discovery.
		if m := a.Metrics.Workers; m != nil {
			m.Discovered.WithLabelValues("static", "ready").Set(float64(len(static)))
			m.Refreshes.WithLabelValues("static").Inc()
			m.LastRefresh.WithLabelValues("static").SetToCurrentTime()
		}
	} else {
		src, err := a.discoverySource(d.Mode, d.Role, "", d.Kubernetes, d.DNS, static, u)
		if err != nil {
			return nil, err
		}
		all = append(all, src)
	}
	for i, s := range d.Sources {
		k := s.Kubernetes
		if k.HTTPPortName == "" {
			k.HTTPPortName = d.Kubernetes.HTTPPortName
		}
		if k.KVEventsPortName == "" {
			k.KVEventsPortName = d.Kubernetes.KVEventsPortName
		}
		label := s.Mode + ":" + s.Role
		if s.Role == "" {
			label = fmt.Sprintf("%s:%d", s.Mode, i)
		}
		src, err := a.discoverySource(s.Mode, s.Role, label, k, s.DNS, static, u)
		if err != nil {
			return nil, err
		}
		all = append(all, src)
	}
	switch len(all) {
	case 0:
		return nil, nil
	case 1:
		return all[0], nil
	}
	return all, nil
}

// discoverySource builds one source of mode with role: its workers go into u when set,
// else static ∪ its own into the registry; label names it in the discovery metrics
// ("" the mode).
func (a *App) discoverySource(mode, role, label string, k config.KubernetesDiscovery, dns config.DNSDiscovery, static []*workers.Worker, u *workers.Union) (workers.Source, error) {
	d := a.Config.Discovery
	models := d.Models
	if len(models) == 0 {
		for _, m := range a.Config.Models {
			models = append(models, m.Name)
		}
	}
	r, err := workers.ParseRole(role)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	tmpl := workers.Template{Models: models, KVEventsEndpoint: d.KVEventsEndpoint, KVEventsReplayEndpoint: d.KVEventsReplayEndpoint,
		Profile: workerProfile(d.Profile), Role: r}
	switch mode {
	case "dns":
		return &workers.DNS{Registry: a.Registry, Name: dns.Name, HTTPPort: dns.HTTPPort, KVPort: dns.KVEventsPort,
			Interval: d.RefreshInterval, Template: tmpl, Static: static, Union: u, Source: label, Metrics: a.Metrics.Workers, Logger: a.Logger}, nil
	case "kubernetes":
		client, ns, err := workers.InClusterClient()
		if err != nil {
			return nil, err
		}
		if k.Namespace != "" {
			ns = k.Namespace
		}
		return &workers.Kubernetes{Registry: a.Registry, Client: client, Namespace: ns, Service: k.Service,
			LabelSelector: k.LabelSelector, HTTPPortName: k.HTTPPortName, KVPortName: k.KVEventsPortName,
			Resync: d.RefreshInterval, Template: tmpl, Static: static, Union: u, Source: label, Metrics: a.Metrics.Workers, Logger: a.Logger}, nil
	}
	return nil, fmt.Errorf("discovery: %w", &config.FieldError{Key: "discovery.mode", Problem: "unknown mode " + mode})
}
