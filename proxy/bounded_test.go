package proxy

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
)

// The proxy authenticates before it reads or parses a body (a client without a key
// gets 401 even for a body that would not parse), and bounds a token-id prompt while
// parsing it: router.max_prompt_tokens (131072 by default) + 1 ids is a 400 saying so.
func TestProxyAuthenticatesBeforeParsingAndBoundsTokenIDs(t *testing.T) {
	keys := apiKeyFile(t, "sk-a", "alpha")
	srv, _, _ := admissionProxy(t, func(c *config.Admission) {
		c.Identity, c.APIKeysFile, c.RequireTenant = []string{"api_key"}, keys, true
	})
	long := `{"model":"m","prompt":[` + strings.Repeat("7,", 131072) + `7]}`
	if resp, body := admPost(t, srv.URL+"/v1/completions", long, nil); resp.StatusCode != 401 {
		t.Fatalf("no key, long body: %d %s, want 401 before the body is parsed", resp.StatusCode, body)
	}
	if resp, body := admPost(t, srv.URL+"/v1/completions", `{"model":`, nil); resp.StatusCode != 401 {
		t.Fatalf("no key, malformed body: %d %s, want 401", resp.StatusCode, body)
	}
	resp, body := admPost(t, srv.URL+"/v1/completions", long, map[string]string{"Authorization": "Bearer sk-a"})
	if resp.StatusCode != 400 || !strings.Contains(body, "more than 131072 elements") || !strings.Contains(body, "invalid_request_error") {
		t.Fatalf("131073 token ids: %d %s, want a 400 naming the bound", resp.StatusCode, body)
	}
}

// apiKeyFile writes an admission.api_keys_file holding key for tenant and returns its path.
func apiKeyFile(t *testing.T, key, tenant string) string {
	t.Helper()
	p := t.TempDir() + "/keys"
	line := ""
	for _, b := range admission.KeyHash(key) {
		line += string("0123456789abcdef"[b>>4]) + string("0123456789abcdef"[b&15])
	}
	if err := writeFile(p, line+" "+tenant+"\n"); err != nil {
		t.Fatal(err)
	}
	return p
}
