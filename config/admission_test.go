package config

import (
	"strings"
	"testing"
)

// The admission section loads from YAML (tenants with squashed limits) and every
// invalid value is refused with its key.
func TestAdmissionLoadAndValidate(t *testing.T) {
	file := writeFile(t, `admission:
  identity: [metadata, header, api_key]
  api_keys_file: /etc/kvroute/keys
  trusted_peers: [10.0.0.0/8, "::1"]
  weights: {cached: 0.1}
  default: {requests_per_minute: 60}
  tenants:
    - {name: acme, tokens_per_minute: 100000, max_concurrent: 8}
`)
	c, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": file}))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Admission
	if len(a.Tenants) != 1 || a.Tenants[0].Name != "acme" || a.Tenants[0].TokensPerMinute != 100000 || a.Tenants[0].MaxConcurrent != 8 ||
		a.Weights.Cached != 0.1 || a.Weights.Uncached != 1 || a.Default.RequestsPerMinute != 60 || len(a.Identity) != 3 {
		t.Fatalf("%+v", a)
	}
	cases := map[string]string{
		"identity: [password]":                                          "admission.identity",
		"identity: [header, header]":                                    "admission.identity",
		"identity: [api_key]":                                           "admission.api_keys_file",
		"trusted_peers: [example.com]":                                  "admission.trusted_peers",
		"tenant_header: X-Tenant":                                       "admission.tenant_header",
		"backend: memcached":                                            "admission.backend",
		"weights: {output: -1}":                                         "admission.weights",
		"default_output_tokens: 0":                                      "admission.default_output_tokens",
		"tenants: [{name: a}, {name: a}]":                               "admission.tenants",
		"tenants: [{name: a, tokens_per_minute: -5}]":                   "admission.tenants",
		"metrics_max_tenants: -1":                                       "admission.metrics_max_tenants",
		"identity: [metadata]\n  claim: ''":                             "admission.claim",
		"tenants: [{name: a, tokens_per_minut: 5}]":                     "tokens_per_minut",
		"classes: [{name: a, on_slo_miss: drop}]":                       "on_slo_miss",
		"classes: [{name: a, ttft_objective: 1s, slo_attainment: 0.3}]": "slo_attainment",
		"classes: [{name: a, ttft_objective: 1s, slo_attainment: 1}]":   "slo_attainment",
	}
	for y, want := range cases {
		_, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": writeFile(t, "admission:\n  "+y+"\n")}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v must mention %q", y, err, want)
		}
	}
}
