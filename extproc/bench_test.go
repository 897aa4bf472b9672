package extproc

import (
	"context"
	"fmt"
	"github.com/kvroute/kvroute/response"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// chatOfSize returns a chat body of about n bytes: a system prompt and user turns of
// ~1 KiB each (a long multi-turn conversation, the shape that dominates prefix reuse).
func chatOfSize(n int) string {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":128,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	turn := strings.Repeat("lorem ipsum dolor sit amet ", 38) // ~1 KiB
	for i := 0; sb.Len() < n-64; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&sb, `,{"role":%q,"content":%q}`, role, turn)
	}
	sb.WriteString(`]}`)
	return sb.String()
}

// BenchmarkExtProcOverhead is kvroute's cost per request on the ext_proc path: one
// stream, BUFFERED request body (headers, whole body → parse, pick, book), response
// headers, a streamed SSE answer (first token, usage, end_of_stream → Done), over a
// real gRPC connection on an in-memory listener. Client-side (stand-in) marshalling
// is included, network latency is not. Sizes: 4 KB (a short chat), 64 KB, 220 KB (a
// long agent context, ~55k tokens), 1 MB (~250k tokens).
func BenchmarkExtProcOverhead(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 220 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("body=%dKB", size>>10), func(b *testing.B) {
			h := newHarness(b)
			body := chatOfSize(size)
			hdr := withPC(hdrs(false, post("/v1/chat/completions", "content-length", fmt.Sprint(len(body)))...), modeBuffered, modeStreamed)
			msgs := []*extprocv3.ProcessingRequest{body1(body), rspHdrs(false, ":status", "200", "content-type", "text/event-stream"), rspBody(sse, false), rspBody("", true)}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithCancel(context.Background())
				s, err := h.client.Process(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Send(hdr); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Recv(); err != nil {
					b.Fatal(err)
				}
				for _, m := range msgs {
					if err := s.Send(m); err != nil {
						b.Fatal(err)
					}
					if _, err := s.Recv(); err != nil {
						b.Fatal(err)
					}
				}
				s.CloseSend()
				cancel()
			}
			b.StopTimer()
			deadline := time.Now().Add(5 * time.Second)
			for h.router.InFlight() != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := h.router.InFlight(); n != 0 {
				b.Fatalf("%d tickets left open", n)
			}
		})
	}
}

func body1(s string) *extprocv3.ProcessingRequest { return body(s, true) }

// BenchmarkDecision is the router's decision throughput with the default policy
// (scoring.policy kvroute): Pick (block hashing, index lookup over 64 workers, TTFT
// prediction per worker, booking under the lock) and Done (learning), for a
// completions request carrying 2,048 prompt token ids (PathGiven: no tokenizer cost)
// whose first 1,024 tokens are cached on one worker.
func BenchmarkDecision(b *testing.B) {
	for _, nw := range []int{64} {
		b.Run(fmt.Sprintf("workers=%d", nw), func(b *testing.B) {
			reg := workers.NewRegistry()
			ws := make([]*workers.Worker, nw)
			for i := range ws {
				ws[i] = &workers.Worker{Name: fmt.Sprintf("w%02d", i), Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), Models: []string{"m"}}
			}
			reg.Set(ws)
			idx := kvindex.New(kvindex.Options{SpeculativeTTL: time.Hour})
			pol, err := scoring.New(scoring.PolicyKVRoute, scoring.Options{}) // the default policy (learning predictor)
			if err != nil {
				b.Fatal(err)
			}
			r := router.New(router.Options{Registry: reg, Index: idx, Policy: pol, Models: []router.Model{{Name: "m", BlockSize: 16}}, Metrics: metrics.NewUnregistered()})
			ids := make([]uint32, 2048)
			for i := range ids {
				ids[i] = uint32(i*7919) % 151000
			}
			req := &request.Request{API: request.APICompletions, Model: "m", PromptTokenIDs: [][]uint32{ids}}
			keys := kvindex.HashBlocks(kvindex.Namespace{Model: "m"}.Seed(), ids[:1024], 16, nil)
			idx.Speculate("w07", keys) // a cached half-prompt on one worker
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t, err := r.Pick(ctx, req, router.PickOptions{RequestID: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				t.Done(200, zeroUsage, time.Time{})
			}
		})
	}
}

var zeroUsage response.Usage
