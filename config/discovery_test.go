package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDiscoveryKeysLoad(t *testing.T) {
	p := writeFile(t, `
models: [{name: m1}]
discovery:
  mode: kubernetes
  refresh_interval: 1m
  models: [m1]
  kv_events_endpoint: "tcp://{ip}:{port}"
  profile: {prefill_tokens_per_second: 9000, max_num_seqs: 1024}
  kubernetes: {namespace: llm, service: vllm}
`)
	fs := Flags("test")
	if err := fs.Parse([]string{"--config", p, "--discovery.kubernetes.label_selector=tier=gpu"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(fs, env(map[string]string{"KVROUTE_DISCOVERY_DNS_HTTP_PORT": "8080"}))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Discovery
	if d.Mode != "kubernetes" || d.RefreshInterval != time.Minute || d.Kubernetes.Service != "vllm" || d.Kubernetes.Namespace != "llm" ||
		d.Kubernetes.LabelSelector != "tier=gpu" || d.Kubernetes.HTTPPortName != "http" || d.Kubernetes.KVEventsPortName != "kv-events" ||
		d.DNS.HTTPPort != 8080 || d.Profile.PrefillTokensPerSecond != 9000 || d.Profile.MaxNumSeqs != 1024 || len(d.Models) != 1 || d.KVEventsEndpoint != "tcp://{ip}:{port}" {
		t.Fatalf("discovery keys from file, flag, env and defaults: %+v", d)
	}
}

func TestDiscoveryValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Discovery)
		key  string
	}{
		{"unknown mode", func(d *Discovery) { d.Mode = "consul" }, "discovery.mode"},
		{"kubernetes without service or selector", func(d *Discovery) { d.Mode = "kubernetes" }, "discovery.kubernetes.service"},
		{"dns without name", func(d *Discovery) { d.Mode = "dns" }, "discovery.dns.name"},
		{"dns bad port", func(d *Discovery) { d.Mode, d.DNS.Name, d.DNS.HTTPPort = "dns", "vllm", 0 }, "discovery.dns.http_port"},
		{"dns bad kv port", func(d *Discovery) { d.Mode, d.DNS.Name, d.DNS.KVEventsPort = "dns", "vllm", 70000 }, "discovery.dns.kv_events_port"},
		{"refresh too short", func(d *Discovery) { d.Mode, d.DNS.Name, d.RefreshInterval = "dns", "vllm", time.Millisecond }, "discovery.refresh_interval"},
		{"template not zmq", func(d *Discovery) { d.Mode, d.DNS.Name, d.KVEventsEndpoint = "dns", "vllm", "http://{ip}:5557" }, "discovery.kv_events_endpoint"},
		{"replay template not zmq", func(d *Discovery) {
			d.Mode, d.Kubernetes.Service, d.KVEventsReplayEndpoint = "kubernetes", "vllm", "{ip}:5558"
		}, "discovery.kv_events_replay_endpoint"},
		{"negative rate", func(d *Discovery) { d.Mode, d.DNS.Name, d.Profile.DecodeTokensPerSecond = "dns", "vllm", -1 }, "discovery.profile"},
		{"negative max_num_seqs", func(d *Discovery) { d.Mode, d.DNS.Name, d.Profile.MaxNumSeqs = "dns", "vllm", -1 }, "discovery.profile.max_num_seqs"},
		{"unknown role", func(d *Discovery) { d.Mode, d.DNS.Name, d.Role = "dns", "vllm", "producer" }, "discovery.role"},
		{"source mode", func(d *Discovery) { d.Sources = []DiscoverySource{{Mode: "static"}} }, "discovery.sources[0].mode"},
		{"source dns without name", func(d *Discovery) { d.Sources = []DiscoverySource{{Mode: "dns", DNS: DNSDiscovery{HTTPPort: 8000}}} }, "discovery.sources[0].dns.name"},
		{"source role", func(d *Discovery) {
			d.Sources = []DiscoverySource{{Mode: "kubernetes", Role: "kv_both", Kubernetes: KubernetesDiscovery{Service: "p"}}}
		}, "discovery.sources[0].role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mod(&c.Discovery)
			err := c.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Key != tc.key {
				t.Fatalf("want an error on %s, got %v", tc.key, err)
			}
		})
	}
	c := Default()
	c.Discovery.Mode, c.Discovery.Kubernetes.LabelSelector = "kubernetes", "app=vllm"
	if err := c.Validate(); err != nil {
		t.Fatalf("a label selector alone selects the slices: %v", err)
	}
	c = Default()
	c.Discovery.Mode, c.Discovery.DNS.Name = "dns", "vllm.llm.svc.cluster.local"
	if err := c.Validate(); err != nil || !strings.Contains(c.Discovery.DNS.Name, "svc") {
		t.Fatalf("dns with a name is valid: %v", err)
	}
}
