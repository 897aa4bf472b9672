package request

import "testing"

// WithoutKVTransferParams removes only a top-level member of chat and completions
// bodies, keeping the other members' order and bytes; anything else is returned as is.
func TestWithoutKVTransferParams(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
		api            API
		stripped       bool
	}{
		{"chat", `{"model":"m","kv_transfer_params":{"remote_host":"203.0.113.9"},"messages":[],"n":1.50}`, `{"model":"m","messages":[],"n":1.50}`, APIChat, true},
		{"completions last", `{"prompt":"x","kv_transfer_params":null}`, `{"prompt":"x"}`, APICompletions, true},
		{"in a string", `{"prompt":"\"kv_transfer_params\":1"}`, `{"prompt":"\"kv_transfer_params\":1"}`, APICompletions, false},
		{"nested", `{"prompt":"x","extra":{"kv_transfer_params":{}}}`, `{"prompt":"x","extra":{"kv_transfer_params":{}}}`, APICompletions, false},
		{"messages API", `{"kv_transfer_params":{}}`, `{"kv_transfer_params":{}}`, APIMessages, false},
		{"not JSON", `{"kv_transfer_params":`, `{"kv_transfer_params":`, APIChat, false},
	} {
		got, ok := WithoutKVTransferParams([]byte(c.in), c.api, 0)
		if string(got) != c.want || ok != c.stripped {
			t.Errorf("%s: %s (%v), want %s (%v)", c.name, got, ok, c.want, c.stripped)
		}
	}
}
