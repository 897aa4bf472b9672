package request

import (
	"encoding/json"
	"fmt"
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
