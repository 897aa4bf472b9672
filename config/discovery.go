package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// Discovery configures where workers come from besides the static list. With a mode
// other than "static", the discovered workers are added to the static ones (which may
// be empty) and follow the source live.
type Discovery struct {
	// Mode is "static" (the workers list only), "kubernetes" (EndpointSlices of a
	// Service) or "dns" (A/AAAA records of a name, e.g. a headless Service).
	Mode string `mapstructure:"mode"`
	// RefreshInterval is the DNS lookup period and the Kubernetes informer resync
	// period (a full re-list; changes themselves arrive at once through the watch).
	RefreshInterval time.Duration `mapstructure:"refresh_interval"`
	// Models lists the served model names of discovered workers; empty = every
	// configured model (or any model when none are configured).
	Models []string `mapstructure:"models"`
	// KVEventsEndpoint is a template for a discovered worker's ZMQ PUB endpoint:
	// {ip} is replaced by the worker's IP, {port} by its kv events port (Kubernetes:
	// the port named kubernetes.kv_events_port_name). "" = no KV events (speculative
	// "approximate" mode).
	KVEventsEndpoint string `mapstructure:"kv_events_endpoint"`
	// KVEventsReplayEndpoint is the same template for the ZMQ ROUTER replay endpoint;
	// "" = no replay.
	KVEventsReplayEndpoint string `mapstructure:"kv_events_replay_endpoint"`
	// Profile is the speed prior of every discovered worker.
	Profile WorkerProfile `mapstructure:"profile"`

	// Role is the prefill/decode role of every worker this source discovers (prefill,
	// decode, both; "" aggregated): EndpointSlices and DNS records carry no pod labels.
	Role string `mapstructure:"role"`

	Kubernetes KubernetesDiscovery `mapstructure:"kubernetes"`
	DNS        DNSDiscovery        `mapstructure:"dns"`

	// Sources are further sources beside the one above (e.g. a prefill Service and a
	// decode Service, each with its role), run whatever Mode is; each shares
	// refresh_interval, models, the KV event templates and profile above.
	Sources []DiscoverySource `mapstructure:"sources"`
}

// DiscoverySource is one further discovery source (Discovery.Sources).
type DiscoverySource struct {
	Mode string `mapstructure:"mode"` // kubernetes or dns
	Role string `mapstructure:"role"` // as Discovery.Role
	// Kubernetes: an empty port name is discovery.kubernetes's; DNS: http_port must be
	// set, kv_events_port 0 = none.
	Kubernetes KubernetesDiscovery `mapstructure:"kubernetes"`
	DNS        DNSDiscovery        `mapstructure:"dns"`
}

// KubernetesDiscovery selects EndpointSlices. kvroute needs list and watch on
// discovery.k8s.io endpointslices in Namespace (examples/kubernetes/rbac.yaml).
type KubernetesDiscovery struct {
	// Namespace of the Service; "" = kvroute's own namespace (in-cluster).
	Namespace string `mapstructure:"namespace"`
	// Service is the Service whose EndpointSlices list the workers (they carry the
	// label kubernetes.io/service-name=<Service>). A headless Service is enough.
	Service string `mapstructure:"service"`
	// LabelSelector further restricts the EndpointSlices (Kubernetes selector syntax).
	LabelSelector string `mapstructure:"label_selector"`
	// HTTPPortName names the EndpointSlice port of the OpenAI HTTP API ("" = the only port).
	HTTPPortName string `mapstructure:"http_port_name"`
	// KVEventsPortName names the port of the ZMQ KV event publisher; its number fills
	// {port} in discovery.kv_events_endpoint.
	KVEventsPortName string `mapstructure:"kv_events_port_name"`
}

// DNSDiscovery resolves a name periodically; every address becomes a worker.
type DNSDiscovery struct {
	Name     string `mapstructure:"name"`      // e.g. vllm.default.svc.cluster.local (headless) or a compose service
	HTTPPort int    `mapstructure:"http_port"` // port of the OpenAI HTTP API on every address
	// KVEventsPort fills {port} in discovery.kv_events_endpoint; 0 = none.
	KVEventsPort int `mapstructure:"kv_events_port"`
}

func defaultDiscovery() Discovery {
	return Discovery{
		Mode:            "static",
		RefreshInterval: workers.DefaultDNSInterval,
		Kubernetes:      KubernetesDiscovery{HTTPPortName: "http", KVEventsPortName: "kv-events"},
		DNS:             DNSDiscovery{HTTPPort: 8000, KVEventsPort: 5557},
	}
}

func (d Discovery) validate() error {
	if _, err := workers.ParseRole(d.Role); err != nil {
		return fieldErr("discovery.role", "%v", err)
	}
	for i, src := range d.Sources {
		key := fmt.Sprintf("discovery.sources[%d]", i)
		if src.Mode != "kubernetes" && src.Mode != "dns" {
			return fieldErr(key+".mode", "unknown mode %q (one of kubernetes, dns)", src.Mode)
		}
		one := d
		one.Mode, one.Role, one.Kubernetes, one.DNS, one.Sources = src.Mode, src.Role, src.Kubernetes, src.DNS, nil
		if err := one.validate(); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				return fieldErr(key+strings.TrimPrefix(fe.Key, "discovery"), "%s", fe.Problem)
			}
			return err
		}
	}
	switch d.Mode {
	case "static":
		return nil
	case "kubernetes":
		if d.Kubernetes.Service == "" && d.Kubernetes.LabelSelector == "" {
			return fieldErr("discovery.kubernetes.service", "discovery.mode=kubernetes requires discovery.kubernetes.service or discovery.kubernetes.label_selector")
		}
	case "dns":
		if d.DNS.Name == "" {
			return fieldErr("discovery.dns.name", "discovery.mode=dns requires discovery.dns.name")
		}
		if d.DNS.HTTPPort <= 0 || d.DNS.HTTPPort > 65535 {
			return fieldErr("discovery.dns.http_port", "must be in 1..65535, got %d", d.DNS.HTTPPort)
		}
		if d.DNS.KVEventsPort < 0 || d.DNS.KVEventsPort > 65535 {
			return fieldErr("discovery.dns.kv_events_port", "must be in 0..65535, got %d", d.DNS.KVEventsPort)
		}
	default:
		return fieldErr("discovery.mode", "unknown mode %q (one of static, kubernetes, dns)", d.Mode)
	}
	if d.RefreshInterval < time.Second {
		return fieldErr("discovery.refresh_interval", "must be ≥ 1s, got %s", d.RefreshInterval)
	}
	for _, t := range []struct{ key, v string }{{"discovery.kv_events_endpoint", d.KVEventsEndpoint}, {"discovery.kv_events_replay_endpoint", d.KVEventsReplayEndpoint}} {
		if t.v != "" && !strings.HasPrefix(t.v, "tcp://") && !strings.HasPrefix(t.v, "ipc://") {
			return fieldErr(t.key, "%q must be a ZMQ endpoint template (tcp://{ip}:{port} or ipc://path)", t.v)
		}
	}
	if d.Profile.PrefillTokensPerSecond < 0 || d.Profile.DecodeTokensPerSecond < 0 {
		return fieldErr("discovery.profile", "token rates must be ≥ 0")
	}
	if d.Profile.MaxNumSeqs < 0 {
		return fieldErr("discovery.profile.max_num_seqs", "must be ≥ 0 requests, got %d", d.Profile.MaxNumSeqs)
	}
	return nil
}
