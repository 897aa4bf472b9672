package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkParse is request.Parse alone on chat bodies of ~4, 64, 220 KB and 1 MB (the
// sizes of BenchmarkExtProcOverhead), to separate parsing from the ext_proc path;
// escapes=yes gives every message newlines and quotes (source code, logs), which
// JSON escapes.
func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		size int
		esc  bool
	}{{4 << 10, false}, {64 << 10, false}, {220 << 10, false}, {220 << 10, true}, {1 << 20, false}} {
		turn := strings.Repeat("lorem ipsum dolor sit amet ", 38)
		name := fmt.Sprintf("body=%dKB", c.size>>10)
		if c.esc {
			turn = strings.Repeat("if x {\n\treturn \"a\"\n}\n", 50)
			name += "/escapes=yes"
		}
		size := c.size
		var sb strings.Builder
		sb.WriteString(`{"model":"m","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
		for i := 0; sb.Len() < size-64; i++ {
			fmt.Fprintf(&sb, `,{"role":"user","content":%q}`, turn)
		}
		sb.WriteString(`]}`)
		body := []byte(sb.String())
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Parse(APIChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The baseline the ratio is taken against, in the same run: encoding/json
		// into maps (what a router without its own parser does).
		b.Run(name+"/parser=encoding_json_maps", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var v map[string]any
				if err := json.Unmarshal(body, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// tokenIDBody is a /v1/completions body whose prompt is n token ids (values up to
// ~150 000, the vocabulary of current models, written as a client writes them).
func tokenIDBody(n int) []byte {
	var b bytes.Buffer
	b.Grow(n*7 + 64)
	b.WriteString(`{"model":"m","max_tokens":16,"prompt":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa((i * 7919) % 151_000))
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// BenchmarkParseTokenIDs is Parse of a token-id prompt of 1 M ids: bytes/id is what
// parsing allocates per id (the ids themselves are 4 bytes), allocs/1M-ids the number
// of allocations for a whole prompt.
func BenchmarkParseTokenIDs(b *testing.B) {
	const n = 1 << 20
	body := tokenIDBody(n)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < b.N; i++ {
		r, err := Parse(APICompletions, body)
		if err != nil || len(r.PromptTokenIDs[0]) != n {
			b.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	per := float64(b.N) * n
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/per, "B/id")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N)*(1e6/n), "allocs/1M-ids")
}
