package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default() must validate: %v", err)
	}
}

// Precedence is flag > environment > file > default, for scalar and list keys.
func TestPrecedence(t *testing.T) {
	p := writeFile(t, `
router:
  ticket_ttl: 2m
models: [{name: m1}]
workers:
  - address: 127.0.0.1:8001
`)
	fs := Flags("test")
	if err := fs.Parse([]string{"--config", p, "--router.default_block_size=32"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(fs, env(map[string]string{
		"KVROUTE_ROUTER_TICKET_TTL":         "3m",
		"KVROUTE_ROUTER_DEFAULT_BLOCK_SIZE": "64",
		"KVROUTE_EXTPROC_SLO_HEADER":        "x-slo",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Router.TicketTTL != 3*time.Minute {
		t.Errorf("env must override file: ticket_ttl = %s, want 3m", c.Router.TicketTTL)
	}
	if c.Router.DefaultBlockSize != 32 {
		t.Errorf("flag must override env: default_block_size = %d, want 32", c.Router.DefaultBlockSize)
	}
	if c.ExtProc.SLOHeader != "x-slo" || c.ExtProc.DestinationHeader != "x-gateway-destination-endpoint" {
		t.Errorf("env value / default lost: %+v", c.ExtProc)
	}
	if len(c.Workers) != 1 || c.Workers[0].Address != "127.0.0.1:8001" {
		t.Errorf("workers from file lost: %+v", c.Workers)
	}
}

func TestListFromEnvironment(t *testing.T) {
	c, err := Load(nil, env(map[string]string{
		"KVROUTE_WORKERS": `[{"address": "127.0.0.1:9001", "models": ["a"]}, {address: "127.0.0.1:9002"}]`,
		"KVROUTE_MODELS":  `[{name: a, block_size: 32}]`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Workers) != 2 || c.Workers[1].Address != "127.0.0.1:9002" || c.Models[0].BlockSize != 32 {
		t.Fatalf("lists from env not applied: %+v %+v", c.Workers, c.Models)
	}
}

// Every validation error names the key and the problem.
func TestValidationNamesTheKey(t *testing.T) {
	cases := []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"unknown key", "router: {ticket_tll: 1m}\n", nil, "ticket_tll"},
		{"bad duration", "", map[string]string{"KVROUTE_ROUTER_TICKET_TTL": "soon"}, "ticket_ttl"},
		{"too small", "", map[string]string{"KVROUTE_ROUTER_TICKET_TTL": "10ms"}, "router.ticket_ttl: must be ≥ 1s"},
		{"hostname worker", "workers: [{address: 'vllm-0:8000'}]\n", nil, "workers[0].address"},
		{"envoy header", "", map[string]string{"KVROUTE_EXTPROC_DESTINATION_HEADER": "x-envoy-original-dst-host"}, "extproc.destination_header"},
		{"unknown worker model", "models: [{name: a}]\nworkers: [{address: '127.0.0.1:1', models: [b]}]\n", nil, "workers[0].models[0]"},
		{"negative max_num_seqs", "workers: [{address: '127.0.0.1:1', profile: {max_num_seqs: -1}}]\n", nil, "workers[0].profile.max_num_seqs: must be ≥ 0 requests, got -1"},
		{"duplicate worker", "workers: [{address: '127.0.0.1:1'}, {address: '127.0.0.1:1'}]\n", nil, "workers[1].name"},
		{"bad list env", "", map[string]string{"KVROUTE_WORKERS": "[{"}, "workers"},
		{"bad policy", "", map[string]string{"KVROUTE_SCORING_POLICY": "best-effort"}, "scoring.policy"},
		{"rewrite to an unknown model", "models: [{name: big}, {name: small}]\nclassify: {rules: [{name: cheap, regex: x, model: tiny}]}\n", nil,
			`classify.rules[0].model: rule "cheap" rewrites to model "tiny", which is not one of models [big small]`},
		{"remote without a model", "classify: {remote: {url: 'http://10.0.0.9:8000/classify'}}\n", nil, "classify.remote.model: is required"},
		{"remote url", "classify: {remote: {url: '10.0.0.9:8000', model: m}}\n", nil, "classify.remote.url: must be an http"},
		{"remote timeout", "", map[string]string{"KVROUTE_CLASSIFY_REMOTE_TIMEOUT": "0s"}, "classify.remote.timeout: must be > 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env
			if e == nil {
				e = map[string]string{}
			}
			if tc.file != "" {
				e["KVROUTE_CONFIG"] = writeFile(t, tc.file)
			}
			_, err := Load(nil, env(e))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v must mention %q", err, tc.want)
			}
		})
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": "/nonexistent/kvroute.yaml"}))
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/kvroute.yaml") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}

// A misspelt KVROUTE_* variable is an error naming it, not a silent no-op.
func TestCheckEnviron(t *testing.T) {
	if err := CheckEnviron([]string{"PATH=/bin", "KVROUTE_CONFIG=x", "KVROUTE_ROUTER_TICKET_TTL=1m"}); err != nil {
		t.Fatalf("known variables rejected: %v", err)
	}
	err := CheckEnviron([]string{"KVROUTE_ROUTER_TIKET_TTL=5s", "KVROUTE_ROUTER_TICKET_TTL=1m"})
	if err == nil || !strings.Contains(err.Error(), "KVROUTE_ROUTER_TIKET_TTL") {
		t.Fatalf("want an error naming KVROUTE_ROUTER_TIKET_TTL, got %v", err)
	}
}

func TestUnknownTopLevelKeyInOurTerms(t *testing.T) {
	_, err := Load(nil, env(map[string]string{"KVROUTE_CONFIG": writeFile(t, "routr: {ticket_ttl: 1m}\n")}))
	if err == nil || !strings.Contains(err.Error(), "unknown configuration keys: routr") {
		t.Fatalf("got %v", err)
	}
}

// A pool whose only workers are prefill workers would answer every request with 503: a
// start-up error naming the model — for static workers, per model, and counting the
// roles of discovery sources; a decode, both or aggregated worker (static or
// discovered) makes it valid.
func TestPrefillOnlyPoolRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*Config)
		err  string // "" valid
	}{
		{"one prefill worker", func(c *Config) { c.Workers = []Worker{{Address: "127.0.0.1:8001", Role: "prefill"}} }, "the pool has only prefill"},
		{"per model", func(c *Config) {
			c.Models = []Model{{Name: "a"}, {Name: "b"}}
			c.Workers = []Worker{{Address: "127.0.0.1:8001", Role: "prefill"}, {Address: "127.0.0.1:8002", Role: "decode", Models: []string{"a"}}}
		}, `model "b" has only prefill`},
		{"discovered prefill only", func(c *Config) {
			c.Discovery.Mode, c.Discovery.DNS.Name, c.Discovery.Role = "dns", "p", "prefill"
		}, "only prefill"},
		{"a decode source", func(c *Config) {
			c.Workers = []Worker{{Address: "127.0.0.1:8001", Role: "prefill"}}
			c.Discovery.Sources = []DiscoverySource{{Mode: "dns", Role: "decode", DNS: DNSDiscovery{Name: "d", HTTPPort: 8000}}}
		}, ""},
		{"an aggregated worker", func(c *Config) {
			c.Workers = []Worker{{Address: "127.0.0.1:8001", Role: "prefill"}, {Address: "127.0.0.1:8002"}}
		}, ""},
		{"no workers", func(c *Config) {}, ""},
	} {
		cfg := Default()
		c.mod(&cfg)
		err := cfg.Validate()
		if c.err == "" && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "workers: ")) {
			t.Errorf("%s: err %v, want one on workers containing %q", c.name, err, c.err)
		}
	}
}

// workers[].role takes prefill, decode, both or nothing; anything else is refused with
// the key named.
func TestWorkerRole(t *testing.T) {
	for _, c := range []struct {
		role string
		ok   bool
	}{{"", true}, {"both", true}, {"prefill", true}, {"decode", true}, {"prefil", false}, {"Decode", false}} {
		cfg := Default()
		cfg.Workers = []Worker{{Address: "127.0.0.1:8001", Role: c.role}, {Address: "127.0.0.1:8002", Role: "decode"}}
		err := cfg.Validate()
		if c.ok && err != nil {
			t.Errorf("role %q: %v", c.role, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "workers[0].role")) {
			t.Errorf("role %q: err %v, want one naming workers[0].role", c.role, err)
		}
	}
}
