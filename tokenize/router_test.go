package tokenize_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/workers"
)

// TestRouterUsesService: the router picks with the Service's ids (local path, prompt
// length known) and degrades visibly for a model without any path.
func TestRouterUsesService(t *testing.T) {
	dir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s missing under CI (make test fetches it)", dir)
		}
		t.Skipf("%s missing: run make tokenizers", dir)
	}
	svc, err := tokenize.NewService(tokenize.ServiceOptions{Models: []tokenize.ModelConfig{
		{Name: "qwen3", Tokenizer: dir},
		{Name: "plain", Paths: []tokenize.Path{tokenize.PathRemote}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w1", Address: "127.0.0.1:9", Models: []string{"qwen3", "plain"}}})
	r := router.New(router.Options{Registry: reg, Tokenizer: svc,
		Models: []router.Model{{Name: "qwen3", BlockSize: 16}, {Name: "plain", BlockSize: 16}}})
	req, _ := request.Parse(request.APIChat, []byte(`{"model":"qwen3","messages":[{"role":"user","content":"Hello there"}]}`))
	tk, err := r.Pick(context.Background(), req, router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := tokenize.LocalTokens(svc.Model("qwen3"), req)
	if tk.Path != tokenize.PathLocal || tk.PromptTokens != len(ids[0]) || tk.Degraded != "" {
		t.Errorf("qwen3 pick: path %s, %d prompt tokens, degraded %q; want local with %d tokens", tk.Path, tk.PromptTokens, tk.Degraded, len(ids[0]))
	}
	tk.Abort()
	// a new request: the first one may still be read by its sampled shadow check
	req2, _ := request.Parse(request.APIChat, []byte(`{"model":"plain","messages":[{"role":"user","content":"Hello there"}]}`))
	tk, err = r.Pick(context.Background(), req2, router.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Path != tokenize.PathNone || tk.Degraded != "remote_no_worker" {
		t.Errorf("plain pick: path %s, degraded %q; want none/remote_no_worker", tk.Path, tk.Degraded)
	}
	tk.Abort()
}
