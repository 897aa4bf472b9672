package app

import (
	"fmt"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/workers"
)

// newDiscovery builds the discovery source named by discovery.mode, or nil for
// "static". Discovered workers are added to the static ones.
func (a *App) newDiscovery() (workers.Source, error) {
	d := a.Config.Discovery
	models := d.Models
	if len(models) == 0 {
		for _, m := range a.Config.Models {
			models = append(models, m.Name)
		}
	}
	tmpl := workers.Template{Models: models, KVEventsEndpoint: d.KVEventsEndpoint, KVEventsReplayEndpoint: d.KVEventsReplayEndpoint,
		Profile: workerProfile(d.Profile)}
	static := staticWorkers(a.Config)
	switch d.Mode {
	case "static", "":
		// The static set never changes: record it once so that dashboards of
		// kvroute_discovery_workers are not empty without discovery.
		if m := a.Metrics.Workers; m != nil {
			m.Discovered.WithLabelValues("static", "ready").Set(float64(len(static)))
			m.Refreshes.WithLabelValues("static").Inc()
			m.LastRefresh.WithLabelValues("static").SetToCurrentTime()
		}
		return nil, nil
	case "dns":
		return &workers.DNS{Registry: a.Registry, Name: d.DNS.Name, HTTPPort: d.DNS.HTTPPort, KVPort: d.DNS.KVEventsPort,
			Interval: d.RefreshInterval, Template: tmpl, Static: static, Metrics: a.Metrics.Workers, Logger: a.Logger}, nil
	case "kubernetes":
		client, ns, err := workers.InClusterClient()
		if err != nil {
			return nil, err
		}
		if d.Kubernetes.Namespace != "" {
			ns = d.Kubernetes.Namespace
		}
		return &workers.Kubernetes{Registry: a.Registry, Client: client, Namespace: ns, Service: d.Kubernetes.Service,
			LabelSelector: d.Kubernetes.LabelSelector, HTTPPortName: d.Kubernetes.HTTPPortName, KVPortName: d.Kubernetes.KVEventsPortName,
			Resync: d.RefreshInterval, Template: tmpl, Static: static, Metrics: a.Metrics.Workers, Logger: a.Logger}, nil
	}
	return nil, fmt.Errorf("discovery: %w", &config.FieldError{Key: "discovery.mode", Problem: "unknown mode " + d.Mode})
}
