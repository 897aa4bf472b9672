package admission

import (
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/response"
)

// The README's example (examples/kvroute-tenants.yaml with examples/tenant-keys.txt)
// loads, and its demo keys identify its two tenants with their limits.
func TestTenantsExampleConfig(t *testing.T) {
	c, err := config.Load(nil, func(k string) (string, bool) {
		if k == config.EnvPrefix+"_CONFIG" {
			return "../examples/kvroute-tenants.yaml", true
		}
		return "", false
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Admission.APIKeysFile = "../" + c.Admission.APIKeysFile // the file names it from the repository root
	a, err := New(Options{Config: c.Admission, Now: fixed})
	if err != nil {
		t.Fatal(err)
	}
	for key, tenant := range map[string]string{"sk-demo-alpha": "alpha", "sk-demo-beta": "beta"} {
		id, err := a.Identify(Input{Header: headers("authorization", "Bearer "+key)})
		if err != nil || id.Tenant != tenant {
			t.Fatalf("%s: %+v %v", tenant, id, err)
		}
	}
	if a.LimitsOf("beta").MaxConcurrent != 4 || a.LimitsOf("alpha").TokensPerMinute != 200000 {
		t.Fatal("example limits not loaded")
	}
	if _, err := a.Identify(Input{Header: headers("x-kvroute-tenant", "alpha")}); err == nil {
		t.Fatal("a tenant header from an unknown peer must not identify (401 expected)")
	}
	// README "Classes, the queue and fair dispatch": alpha interactive (band 10, 2 s, 10 s
	// queue), long prompts long, everyone else batch (60 s queue).
	for _, tc := range []struct {
		in   ClassInput
		want string
		prio int
	}{{ClassInput{Tenant: "alpha", PromptTokens: 50000}, "interactive", 10}, {ClassInput{Tenant: "beta", PromptTokens: 40000}, "long", 0},
		{ClassInput{Tenant: "beta", PromptTokens: 100}, "batch", 0}} {
		if c := a.Classify(tc.in); c.Name != tc.want || c.Priority != tc.prio {
			t.Errorf("%+v: class %s priority %d, want %s %d", tc.in, c.Name, c.Priority, tc.want, tc.prio)
		}
	}
	if q := c.Admission.MaxQueueTime(); q.Seconds() != 60 {
		t.Fatalf("longest max_queue_time %s", q)
	}
}

// The README's worked example: 3,000 prompt tokens, 2,000 cached, max_tokens 100,
// cached priced 0.1 → 1,300 reserved; 40 completion tokens reported → 1,240 settled.
func TestReadmeWorkedExample(t *testing.T) {
	a, _ := newAdmitter(t, func(c *config.Admission) {
		c.Weights = config.CostWeights{Uncached: 1, Cached: 0.1, Output: 1}
		c.DefaultOutputTokens = 512
	})
	g, err := a.Reserve(Identity{Tenant: "beta"}, Want{PromptTokens: 3000, CachedTokens: 2000, MaxTokens: 100})
	if err != nil || g.Reserved() != 1300 {
		t.Fatalf("reserved %d %v", g.Reserved(), err)
	}
	g.Settle(response.Result{Usage: response.Usage{Present: true, PromptTokens: 3000, CompletionTokens: 40}, Outcome: response.OutcomeOK}, -1)
	if st := a.Snapshot()[0]; st.WindowTokens != 1240 {
		t.Fatalf("settled window %d, want 1240", st.WindowTokens)
	}
}
