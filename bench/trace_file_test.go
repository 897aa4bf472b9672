package bench

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The shipped, gzipped Mooncake trace holds the release's 12,031 requests
// (bench/traces/README.md) and parses; where the uncompressed copy of the same release is
// at hand, the two are byte for byte the same.
func TestShippedTrace(t *testing.T) {
	rc, err := OpenTrace(filepath.Join("..", DefaultTracePath))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(raw, []byte("\n")); n != 12031 {
		t.Fatalf("shipped trace has %d lines, want 12031", n)
	}
	w, err := ParseMooncake(bytes.NewReader(raw), TraceOptions{Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Items) != 200 {
		t.Fatalf("parsed %d of the first 200 requests", len(w.Items))
	}
	plain, err := os.ReadFile(filepath.Join("..", "..", "shared", "data", "traces", "mooncake_conversation_trace.jsonl"))
	if err != nil {
		t.Logf("no uncompressed copy to compare with (%v)", err)
		return
	}
	if !bytes.Equal(raw, plain) {
		t.Fatal("shipped trace differs from the uncompressed release")
	}
}

func TestOpenTraceErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenTrace(filepath.Join(dir, "missing.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.jsonl.gz")
	if err := os.WriteFile(bad, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenTrace(bad); err == nil {
		t.Fatal("a .gz file that is not gzip opened")
	}
}
