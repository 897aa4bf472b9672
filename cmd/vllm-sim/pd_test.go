package main

import (
	"strings"
	"testing"
)

// --kv-role takes vLLM's kv_transfer_config kv_role values only.
func TestKVRoleFlagIsValidated(t *testing.T) {
	err := run([]string{"--kv-role", "prefill", "--port", "0", "--kv-port", "0", "--kv-replay-port", "0"})
	if err == nil || !strings.Contains(err.Error(), "kv_producer") {
		t.Fatalf("--kv-role prefill: %v, want an error naming the valid roles", err)
	}
	if err := run([]string{"--kv-transfer-bytes-per-second", "-1", "--port", "0", "--kv-port", "0"}); err == nil {
		t.Fatal("a negative KV transfer bandwidth must be refused")
	}
}
