package admission

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/front"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
)

// The README's example (examples/kvroute-tenants.yaml with examples/tenant-keys.txt)
// loads, and its demo keys identify its two tenants with their limits.
func TestTenantsExampleConfig(t *testing.T) {
	a := exampleAdmitter(t)
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
}

// exampleAdmitter is examples/kvroute-tenants.yaml's admission stage, at fixed().
func exampleAdmitter(t *testing.T) *Admitter {
	t.Helper()
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
	return a
}

// README "Classes, the queue and fair dispatch" with examples/kvroute-tenants.yaml:
// alpha interactive (band 10, 2 s, 10 s queue), long prompts long, everyone else batch
// (60 s queue).
func TestTenantsExampleClasses(t *testing.T) {
	a := exampleAdmitter(t)
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
	if q := a.cfg.MaxQueueTime(); q.Seconds() != 60 {
		t.Fatalf("longest max_queue_time %s", q)
	}
}

// The worked example of docs/tenants.md: 3,000 prompt tokens, 2,000 cached, max_tokens 100,
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

// The README's 429: with examples/kvroute-tenants.yaml, beta's 16th request of the
// worked example (1,300 tokens each, settled at 1,300) within one minute does not fit
// its 20,000 tokens; the reply (status, headers as kvroute sends them, body) is the
// block under "<!-- 429 example -->" in docs/tenants.md, 30 s before the window ends.
func TestReadme429Example(t *testing.T) {
	a := exampleAdmitter(t)
	id := Identity{Tenant: "beta", Source: "api_key"}
	w := Want{PromptTokens: 3000, CachedTokens: 2000, MaxTokens: 100}
	var err error
	for i := 0; err == nil; i++ {
		var g *Grant
		if g, err = a.Reserve(id, w); err == nil {
			g.Settle(response.Result{Outcome: response.OutcomeOK, Usage: response.Usage{Present: true, PromptTokens: 3000,
				CompletionTokens: 100, CachedTokens: 2000, CachedReported: true}}, -1)
		} else if i != 15 {
			t.Fatalf("refused at request %d, docs/tenants.md says the 16th", i+1)
		}
	}
	rep := front.ErrorReply(request.APIChat, err)
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\n", rep.Status, http.StatusText(rep.Status))
	for _, kv := range rep.Header {
		fmt.Fprintf(&b, "%s: %s\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "\n%s\n", rep.Body)
	raw, rerr := os.ReadFile("../docs/tenants.md")
	if rerr != nil {
		t.Fatal(rerr)
	}
	_, after, ok := strings.Cut(string(raw), "<!-- 429 example -->\n```http\n")
	doc, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/tenants.md has no ```http block after <!-- 429 example -->")
	}
	if doc != b.String() {
		t.Fatalf("docs/tenants.md's 429 differs from kvroute's reply.\ndocs:\n%s\nkvroute:\n%s", doc, b.String())
	}
}
