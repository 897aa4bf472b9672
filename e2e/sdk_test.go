package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
)

// The official OpenAI and Anthropic JavaScript SDKs (npm `openai`, `@anthropic-ai/sdk`,
// pinned in testdata/sdk/package-lock.json, fetched by scripts/fetch-sdks.sh into
// .cache/sdk) run small scripts (testdata/sdk/*.mjs) against kvroute in front of
// simulated vLLM engines, through `kvroute proxy` and through the Envoy stand-in
// (ext_proc, buffered request, streamed response): plain and streamed calls with usage,
// and the typed errors each SDK builds from kvroute's refusals — 401 for an unknown API
// key, 429 with retry-after and x-ratelimit-remaining-tokens past a tenant's budget, 400
// naming the field. Skipped only when node is not installed.

// sdkTenantKeys: GOOD_KEY → tenant "good" (no limit), SMALL_KEY → "small" (100 tokens a
// minute: a request reserving max_tokens 5000 is refused), BAD_KEY → no tenant (401,
// admission.require_tenant).
var sdkTenantKeys = map[string]string{"GOOD_KEY": "sk-good", "SMALL_KEY": "sk-small", "BAD_KEY": "sk-unknown"}

func TestOfficialSDKs(t *testing.T) {
	nodeModules := sdkModules(t)
	keys := filepath.Join(t.TempDir(), "keys")
	var lines string
	for tenant, key := range map[string]string{"good": sdkTenantKeys["GOOD_KEY"], "small": sdkTenantKeys["SMALL_KEY"]} {
		lines += hexHash(key) + " " + tenant + "\n"
	}
	if err := os.WriteFile(keys, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, front := range []struct {
		name string
		o    fixtureOpts
	}{
		{"kvroute proxy", fixtureOpts{proxy: true}},
		{"ext_proc (Envoy stand-in)", fixtureOpts{envoy: Config{RequestBodyMode: Buffered, ResponseBodyMode: Streamed}}},
	} {
		t.Run(front.name, func(t *testing.T) {
			o := front.o
			o.simAdapters = []string{}
			o.cfg = func(c *config.Config) {
				c.Admission.Identity = []string{"api_key"}
				c.Admission.APIKeysFile = keys
				c.Admission.RequireTenant = true
				c.Admission.Tenants = []config.TenantLimits{{Name: "small", Limits: config.Limits{TokensPerMinute: 100}}}
			}
			f := newFixture(t, o)
			t.Run("openai", func(t *testing.T) { checkOpenAISDK(t, runSDK(t, nodeModules, "openai.mjs", f.url)) })
			t.Run("anthropic", func(t *testing.T) { checkAnthropicSDK(t, runSDK(t, nodeModules, "anthropic.mjs", f.url)) })
		})
	}
}

// sdkModules returns .cache/sdk/node_modules, fetching the SDKs when absent; it skips
// the test when node is not installed.
func sdkModules(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the official SDK e2e test needs it (scripts/deps.sh installs nodejs and npm)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	nm := filepath.Join(root, ".cache", "sdk", "node_modules")
	if out, err := exec.Command(filepath.Join(root, "scripts", "fetch-sdks.sh")).CombinedOutput(); err != nil {
		t.Fatalf("the SDKs are not in .cache/sdk and scripts/fetch-sdks.sh failed: %v\n%s", err, out)
	}
	return nm
}

// sdkResult is what a script prints: one object per call.
type sdkResult map[string]json.RawMessage

type sdkError struct {
	Class           string `json:"class"`
	Status          int    `json:"status"`
	Type            string `json:"type"`
	Param           string `json:"param"`
	Message         string `json:"message"`
	RetryAfter      string `json:"retryAfter"`
	RemainingTokens string `json:"remainingTokens"`
}

// runSDK runs testdata/sdk/<script> with node against url and decodes its output. The
// script is copied next to a node_modules link, where Node's ESM resolution finds the SDKs.
func runSDK(t *testing.T, nodeModules, script, url string) sdkResult {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{script, "common.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata", "sdk", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(nodeModules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, not a speed check
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, script))
	cmd.Env = append(os.Environ(), "KVROUTE_URL="+url, "MODEL=m")
	for k, v := range sdkTenantKeys {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s\nstdout:\n%s", script, err, stderr.String(), stdout.String())
	}
	var res sdkResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("node %s printed %q: %v", script, stdout.String(), err)
	}
	t.Logf("node %s: %s", script, stdout.String())
	return res
}

func (r sdkResult) get(t *testing.T, key string, v any) {
	t.Helper()
	if err := json.Unmarshal(r[key], v); err != nil {
		t.Fatalf("%s: %v in %s", key, err, r[key])
	}
}

// checkRefusals checks the three typed errors both SDKs must raise.
func checkRefusals(t *testing.T, r sdkResult, wantParam string, anthropic bool) {
	t.Helper()
	var unauth, limited, bad sdkError
	r.get(t, "unauthorized", &unauth)
	r.get(t, "rateLimited", &limited)
	r.get(t, "badRequest", &bad)
	if unauth.Class != "AuthenticationError" || unauth.Status != 401 {
		t.Errorf("unknown key: %+v", unauth)
	}
	if limited.Class != "RateLimitError" || limited.Status != 429 {
		t.Errorf("over budget: %+v", limited)
	}
	if s, err := strconv.Atoi(limited.RetryAfter); err != nil || s < 1 {
		t.Errorf("429 retry-after %q, want whole seconds ≥ 1", limited.RetryAfter)
	}
	if limited.RemainingTokens != "100" { // the tenant has spent nothing yet
		t.Errorf("429 x-ratelimit-remaining-tokens %q, want 100", limited.RemainingTokens)
	}
	if bad.Class != "BadRequestError" || bad.Status != 400 || !strings.Contains(bad.Message, wantParam) {
		t.Errorf("bad request: %+v, want the message to name %s", bad, wantParam)
	}
	limitType := "rate_limit_exceeded" // OpenAI's
	if anthropic {
		limitType = "rate_limit_error"
	} else if bad.Param != wantParam {
		t.Errorf("bad request param %q, want %q", bad.Param, wantParam)
	}
	for _, c := range []struct {
		e    sdkError
		want string
	}{{unauth, "authentication_error"}, {limited, limitType}, {bad, "invalid_request_error"}} {
		if c.e.Type != c.want {
			t.Errorf("%s: error type %q, want %q", c.e.Class, c.e.Type, c.want)
		}
	}
}

// The sim's stand-in ChatML prompt of "hello there" as the only user message.
const sdkChatPrompt = (5 + 2) + 3

func checkOpenAISDK(t *testing.T, r sdkResult) {
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	var plain struct {
		Object, Content, Finish string
		Usage                   usage
	}
	r.get(t, "plain", &plain)
	if plain.Object != "chat.completion" || len(strings.Fields(plain.Content)) != 4 || plain.Finish != "length" ||
		plain.Usage != (usage{sdkChatPrompt, 4, sdkChatPrompt + 4}) {
		t.Errorf("plain chat: %+v", plain)
	}
	type streamed struct {
		Text        string
		Chunks      int
		Usage       *usage
		UsageChunks int
		Finish      string
	}
	var withUsage, noUsage streamed
	r.get(t, "stream", &withUsage)
	r.get(t, "streamNoUsage", &noUsage)
	if len(strings.Fields(withUsage.Text)) != 4 || withUsage.Finish != "length" || withUsage.UsageChunks != 1 ||
		withUsage.Usage == nil || *withUsage.Usage != (usage{sdkChatPrompt, 4, sdkChatPrompt + 4}) {
		t.Errorf("stream with include_usage: %+v", withUsage)
	}
	// role chunk + 4 tokens, and no usage chunk: the client sees the stream it asked for
	if len(strings.Fields(noUsage.Text)) != 4 || noUsage.Usage != nil || noUsage.UsageChunks != 0 || noUsage.Chunks != 5 {
		t.Errorf("stream without include_usage: %+v", noUsage)
	}
	checkRefusals(t, r, "messages", false)
}

func checkAnthropicSDK(t *testing.T, r sdkResult) {
	const prompt = (5 + 2) + (5 + 2) + 3 // system "be brief", user "hello there", generation prompt
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	var plain, stream struct {
		Type, Role, Text, Stop string
		Events                 []string
		Usage                  usage
	}
	r.get(t, "plain", &plain)
	r.get(t, "stream", &stream)
	if plain.Type != "message" || plain.Role != "assistant" || len(strings.Fields(plain.Text)) != 4 || plain.Stop != "max_tokens" ||
		plain.Usage != (usage{prompt, 4}) {
		t.Errorf("plain message: %+v", plain)
	}
	want := "message_start,content_block_start,content_block_delta,content_block_delta,content_block_delta,content_block_delta," +
		"content_block_stop,message_delta,message_stop"
	if strings.Join(stream.Events, ",") != want || len(strings.Fields(stream.Text)) != 4 || stream.Stop != "max_tokens" ||
		stream.Usage != (usage{prompt, 4}) {
		t.Errorf("streamed message: %+v", stream)
	}
	checkRefusals(t, r, "max_tokens", true)
}

func hexHash(key string) string {
	h := admission.KeyHash(key)
	return hex.EncodeToString(h[:])
}
