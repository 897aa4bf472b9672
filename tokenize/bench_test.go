package tokenize

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/jsonvalue"
	"github.com/kvroute/kvroute/request"
)

// BenchmarkEncode measures tokens/s on the 100 KB English corpus text, per family.
// cold: a fresh segment cache each iteration (the text is one run, so the cache never
// helps); this is raw pre-tokenization + BPE speed.
func BenchmarkEncode(b *testing.B) {
	text, err := os.ReadFile(filepath.Join("testdata", "long_en.txt"))
	if err != nil {
		b.Fatal(err)
	}
	for _, fam := range families {
		b.Run("family="+fam+"/text=long_en_100KB", func(b *testing.B) {
			m := loadFamily(b, fam)
			cache := m.cache
			m.cache = nil
			defer func() { m.cache = cache }()
			n := len(m.EncodeText(string(text), false))
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for range b.N {
				m.EncodeText(string(text), false)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// longChat builds a conversation of `turns` messages from the English corpus text,
// each of about perTurn bytes, after a system prompt.
func longChat(tb testing.TB, turns, perTurn int) []jsonvalue.Value {
	text, err := os.ReadFile(filepath.Join("testdata", "long_en.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	src := string(text)
	msgs := jsonvalue.MessagesOf([]map[string]any{{"role": "system", "content": "You are a helpful assistant."}})
	off := 0
	for i := 0; i < turns; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "Turn %d. ", i)
		for sb.Len() < perTurn {
			n := min(perTurn-sb.Len(), len(src)-off)
			sb.WriteString(src[off : off+n])
			off = (off + n) % len(src)
		}
		msgs = append(msgs, jsonvalue.ValueOf(map[string]any{"role": role, "content": sb.String()}))
	}
	return msgs
}

// BenchmarkChat measures a ~100k-token chat (two shapes: 64 long turns and 512 short
// ones): render + tokenize cold (empty segment cache), as the next turn of a
// conversation whose earlier turns are cached, and the template render alone.
func BenchmarkChat(b *testing.B) {
	for _, fam := range []string{"qwen3", "llama3_1"} {
		for _, shape := range []struct{ turns, perTurn int }{{64, 6800}, {512, 850}} {
			m := loadFamily(b, fam)
			msgs := longChat(b, shape.turns, shape.perTurn)
			prev := &request.Request{API: request.APIChat, Messages: msgs[:len(msgs)-1]}
			req := &request.Request{API: request.APIChat, Messages: msgs}
			text, err := m.RenderChat(req)
			if err != nil {
				b.Fatal(err)
			}
			n := len(m.EncodeText(text, false))
			name := fmt.Sprintf("family=%s/tokens=%d/turns=%d", fam, n, shape.turns)
			b.Run(name+"/cache=cold", func(b *testing.B) {
				for range b.N {
					m.cache = newSegmentCache(DefaultCacheBytes, 256)
					t, _ := m.RenderChat(req)
					m.EncodeText(t, false)
				}
			})
			b.Run(name+"/cache=prefix", func(b *testing.B) {
				m.cache = newSegmentCache(DefaultCacheBytes, 256)
				t, _ := m.RenderChat(prev)
				m.EncodeText(t, false)
				b.ResetTimer()
				for range b.N {
					t, _ := m.RenderChat(req)
					m.EncodeText(t, false)
				}
			})
			b.Run(name+"/encode_only/cache=prefix", func(b *testing.B) {
				m.cache = newSegmentCache(DefaultCacheBytes, 256)
				t, _ := m.RenderChat(prev)
				m.EncodeText(t, false)
				full, _ := m.RenderChat(req)
				b.ResetTimer()
				for range b.N {
					m.EncodeText(full, false)
				}
			})
			b.Run(name+"/render_only", func(b *testing.B) {
				for range b.N {
					m.RenderChat(req)
				}
			})
		}
	}
}
