package main

import (
	"os"
	"testing"
)

func TestRealTokensMissingDirFails(t *testing.T) {
	if _, err := realTokens(t.TempDir(), "m"); err == nil {
		t.Fatal("a directory without tokenizer.json was accepted")
	}
}

// TestRealTokensQwen3 runs when scripts/fetch-tokenizers.sh has fetched Qwen3's files.
func TestRealTokensQwen3(t *testing.T) {
	dir := "../../.cache/tokenizers/qwen3"
	if _, err := os.Stat(dir); err != nil {
		t.Skip("no .cache/tokenizers/qwen3 (run scripts/fetch-tokenizers.sh)")
	}
	tok, err := realTokens(dir, "Qwen/Qwen3-8B")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok(true, []byte(`{"messages":[{"role":"user","content":"Hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n
	if len(ids) < 6 || ids[0] != 151644 || ids[1] != 872 {
		t.Fatalf("ids %v", ids)
	}
	if _, err := tok(false, []byte(`{"prompt":{"bad":1}}`)); err == nil {
		t.Error("bad prompt accepted")
	}
}
