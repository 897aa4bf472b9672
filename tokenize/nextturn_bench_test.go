package tokenize_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/tokenize"
)

// BenchmarkNextTurn is the tokenization part of BenchmarkRequestCPU alone: parse a
// chat body and compute its ids (local Qwen3) when the conversation without its last
// turn was tokenized before (512 turns × 0.85 KB ≈ 100k tokens). Bodies are built
// before the timer starts. n is the rendered bytes (stage=render) or the ids (all).
func BenchmarkNextTurn(b *testing.B) {
	dir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		b.Skipf("%s missing: run make tokenizers", dir)
	}
	m, err := tokenize.LoadModel(dir, tokenize.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, shape := range []struct{ turns, perTurn int }{{64, 6800}, {512, 850}} {
		b.Run(fmt.Sprintf("turns=%d", shape.turns), func(b *testing.B) {
			prev, err := request.Parse(request.APIChat, pipelineChat(b, shape.turns-1, shape.perTurn, ""))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tokenize.LocalTokens(m, prev); err != nil {
				b.Fatal(err)
			}
			bodies := make([][]byte, 64)
			for i := range bodies {
				bodies[i] = pipelineChat(b, shape.turns, shape.perTurn, fmt.Sprintf("op %d", benchOps.Add(1)))
			}
			// Stage costs, one op each over the same bodies: parse, parse+render,
			// parse+render+encode (= LocalTokens). cpu-ms/op is process CPU (GC included).
			for _, stage := range []string{"parse", "render", "all"} {
				b.Run("stage="+stage, func(b *testing.B) {
					b.ReportAllocs()
					b.ResetTimer()
					n := 0
					var cpu time.Duration
					for i := range b.N {
						c0 := cpuNow()
						req, err := request.Parse(request.APIChat, bodies[i%len(bodies)])
						if err != nil {
							b.Fatal(err)
						}
						switch stage {
						case "render":
							text, err := m.RenderChat(req)
							if err != nil {
								b.Fatal(err)
							}
							n = len(text)
						case "all":
							ids, err := tokenize.LocalTokens(m, req)
							if err != nil {
								b.Fatal(err)
							}
							n = len(ids[0])
						}
						cpu += cpuNow() - c0
					}
					b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
					b.ReportMetric(float64(n), "n")
				})
			}
		})
	}
}
