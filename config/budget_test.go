package config

import (
	"strings"
	"testing"
	"time"
)

// The redis backend, token windows, per-model limits and redis_down load from YAML;
// every invalid value is refused with its key.
func TestBudgetLoadAndValidate(t *testing.T) {
	file := writeFile(t, `admission:
  backend: redis
  redis: {addr: "10.0.0.5:6380", replicas: 3, down: fail_closed, timeout: 50ms}
  output_history: {samples: 32, min_samples: 4, max_keys: 100}
  tenants:
    - name: acme
      tokens_per_minute: 1000
      redis_down: fail_open
      token_windows: [{window: 24h, tokens: 50000}]
      models: [{model: m1, tokens_per_minute: 300, token_windows: [{window: 1h, tokens: 9000}]}]
`)
	c, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": file}))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Admission
	r := a.Redis
	if a.Backend != "redis" || r.Addr != "10.0.0.5:6380" || r.Replicas != 3 || r.Down != "fail_closed" || r.Timeout != 50*time.Millisecond ||
		r.KeyPrefix != "kvroute:budget:" || r.TicketTTL != time.Hour || a.OutputHistory.Samples != 32 {
		t.Fatalf("%+v", a)
	}
	tn := a.Tenants[0]
	if tn.RedisDown != "fail_open" || len(tn.TokenWindows) != 1 || tn.TokenWindows[0] != (TokenWindow{24 * time.Hour, 50000}) ||
		len(tn.Models) != 1 || tn.Models[0].Model != "m1" || tn.Models[0].TokensPerMinute != 300 || tn.Models[0].TokenWindows[0].Window != time.Hour {
		t.Fatalf("%+v", tn)
	}
	cases := map[string]string{
		"backend: redis\n  redis: {addr: ''}":                                                     "admission.redis.addr",
		"backend: redis\n  redis: {replicas: 0}":                                                  "admission.redis.replicas",
		"backend: redis\n  redis: {timeout: 0s}":                                                  "admission.redis.timeout",
		"backend: redis\n  redis: {ticket_ttl: 10s}":                                              "admission.redis.timeout",
		"redis: {down: maybe}":                                                                    "admission.redis.down",
		"output_history: {min_samples: 100}":                                                      "admission.output_history",
		"default: {redis_down: sometimes}":                                                        "admission.tenants",
		"tenants: [{name: a, token_windows: [{window: 500ms, tokens: 1}]}]":                       "admission.tenants",
		"tenants: [{name: a, token_windows: [{window: 1h, tokens: 0}]}]":                          "admission.tenants",
		"tenants: [{name: a, token_windows: [{window: 1h, tokens: 1}, {window: 1h, tokens: 2}]}]": "admission.tenants",
		"tenants: [{name: a, models: [{model: m}, {model: m}]}]":                                  "admission.tenants",
		"tenants: [{name: a, models: [{model: m, token_windows: [{window: 1000h, tokens: 1}]}]}]": "admission.tenants",
	}
	for y, want := range cases {
		_, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": writeFile(t, "admission:\n  "+y+"\n")}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v must mention %q", y, err, want)
		}
	}
}
