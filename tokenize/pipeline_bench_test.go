package tokenize_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/workers"
)

const pipelineSSE = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"

// pipelineChat returns the body of a chat of `turns` messages of about perTurn bytes
// from the English corpus text (after a system prompt), the last one unique to tag
// (none when tag is ""): pipelineChat(n-1, p, "") is pipelineChat(n, p, tag) without
// its last message, the request an agent sent one turn earlier.
func pipelineChat(tb testing.TB, turns, perTurn int, tag string) []byte {
	text, err := os.ReadFile(filepath.Join("testdata", "long_en.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	src := string(text)
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	off := 0
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		var t strings.Builder
		fmt.Fprintf(&t, "Turn %d. ", i)
		if i == turns-1 && tag != "" {
			t.WriteString(tag + " ")
		}
		for t.Len() < perTurn {
			n := min(perTurn-t.Len(), len(src)-off)
			t.WriteString(src[off : off+n])
			off = (off + n) % len(src)
		}
		c, _ := json.Marshal(t.String())
		fmt.Fprintf(&sb, `,{"role":%q,"content":%s}`, role, c)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// benchOps numbers the last turns of benchmark bodies, so that a -count rerun meets new
// text, as the next turn of a conversation does, never a body it routed already.
var benchOps atomic.Int64

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequestCPU is kvroute's CPU per request on the hot path without the
// transport (issue 17): parse the body, render the chat template and tokenize
// (local Qwen3), hash blocks, look up the prefix index over 8 workers, pick with the
// default policy, book, then track a streamed SSE answer (first token, usage) and end
// the ticket. Shape: ~100k-token chats (64 turns × 6.8 KB ≈ 440 KB of JSON; 512
// turns × 0.85 KB). cache=prev_turn: the same conversation without its last turn was
// routed before (render cache, segment cache and index hold it) and every op's last
// turn is new; cache=prev_turn_full_render: the same without the render cache (the
// whole conversation rendered each turn, only new text runs encoded); cache=cold: no
// render or segment cache, a new index each op. cpu-ms/op is the process's CPU
// time (all threads, GC included) per op: ms·core.
func BenchmarkRequestCPU(b *testing.B) {
	dir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		b.Skipf("%s missing: run make tokenizers", dir)
	}
	// One tokenizer loaded at a time, as in a process serving one model: a second
	// one would double the live heap every GC cycle marks.
	var m *tokenize.Model
	for _, state := range []string{"prev_turn", "prev_turn_full_render", "cold"} {
		opts := tokenize.Options{}
		switch state {
		case "prev_turn_full_render": // the segment cache alone: every turn rendered in full
			opts.RenderCacheBytes = -1
		case "cold":
			opts.CacheBytes, opts.RenderCacheBytes = -1, -1
		}
		m = nil
		var err error
		if m, err = tokenize.LoadModel(dir, opts); err != nil {
			b.Fatal(err)
		}
		for _, shape := range []struct{ turns, perTurn int }{{64, 6800}, {512, 850}} {
			b.Run(fmt.Sprintf("turns=%d/cache=%s", shape.turns, state), func(b *testing.B) {
				svc, err := tokenize.NewService(tokenize.ServiceOptions{Models: []tokenize.ModelConfig{{Name: "qwen3", Model: m, Paths: []tokenize.Path{tokenize.PathLocal}}}})
				if err != nil {
					b.Fatal(err)
				}
				reg := workers.NewRegistry()
				ws := make([]*workers.Worker, 8)
				for i := range ws {
					ws[i] = &workers.Worker{Name: fmt.Sprintf("w%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: []string{"qwen3"}}
				}
				reg.Set(ws)
				newRouter := func() *router.Router {
					pol, err := scoring.New(scoring.PolicyKVRoute, scoring.Options{})
					if err != nil {
						b.Fatal(err)
					}
					return router.New(router.Options{Registry: reg, Index: kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour}),
						Tokenizer: svc, Policy: pol, Models: []router.Model{{Name: "qwen3", BlockSize: 16}}, Metrics: metrics.NewUnregistered()})
				}
				r := newRouter()
				ctx := context.Background()
				route := func(body []byte) int {
					req, err := request.Parse(request.APIChat, body)
					if err != nil {
						b.Fatal(err)
					}
					tk, err := r.Pick(ctx, req, router.PickOptions{RequestID: "bench"})
					if err != nil {
						b.Fatal(err)
					}
					tr := response.NewTracker(true, 0)
					if tr.Write([]byte(pipelineSSE)) {
						tk.FirstToken(time.Now())
					}
					tk.Done(200, tr.Finish(), time.Now())
					return tk.PromptTokens
				}
				// The conversation so far: all turns but the last.
				n := route(pipelineChat(b, shape.turns-1, shape.perTurn, ""))
				// Every op's body is distinct and built before the timer starts (building
				// one is costlier than routing it; its garbage would be counted in cpu).
				bodies := make([][]byte, min(b.N, 256))
				for i := range bodies {
					bodies[i] = pipelineChat(b, shape.turns, shape.perTurn, fmt.Sprintf("op %d", benchOps.Add(1)))
				}
				runtime.GC()
				b.ReportAllocs()
				b.ResetTimer()
				var cpu time.Duration
				for i := range b.N {
					b.StopTimer()
					body := bodies[i%len(bodies)]
					if state == "cold" {
						r = newRouter()
					}
					b.StartTimer()
					c0 := cpuNow()
					n = route(body)
					cpu += cpuNow() - c0
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(n), "tokens")
			})
		}
	}
}
