package tokenize

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// longChat builds a conversation of about `tokens` tokens from the English corpus text:
// turns of ~2 KB each.
func longChat(tb testing.TB, turns int) []map[string]any {
	text, err := os.ReadFile(filepath.Join("testdata", "long_en.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	paras := strings.Split(string(text), "\n\n")
	msgs := []map[string]any{{"role": "system", "content": "You are a helpful assistant. " + paras[0]}}
	for i := 0; i < turns; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": fmt.Sprintf("Turn %d. %s %s", i, paras[(2*i+1)%len(paras)], paras[(2*i+2)%len(paras)])})
	}
	return msgs
}

// BenchmarkChat measures a ~100k-token chat: render + tokenize, cold (empty segment
// cache) and as the next turn of a conversation whose earlier turns are cached.
func BenchmarkChat(b *testing.B) {
	for _, fam := range []string{"qwen3", "llama3"} {
		m := loadFamily(b, fam)
		msgs := longChat(b, 520)
		prev := &request.Request{API: request.APIChat, Messages: msgs[:len(msgs)-1]}
		req := &request.Request{API: request.APIChat, Messages: msgs}
		text, err := m.RenderChat(req)
		if err != nil {
			b.Fatal(err)
		}
		n := len(m.EncodeText(text, false))
		b.Run(fmt.Sprintf("family=%s/tokens=%d/cache=cold", fam, n), func(b *testing.B) {
			for range b.N {
				m.cache = newSegmentCache(DefaultCacheBytes, 256)
				t, _ := m.RenderChat(req)
				m.EncodeText(t, false)
			}
		})
		b.Run(fmt.Sprintf("family=%s/tokens=%d/cache=prefix", fam, n), func(b *testing.B) {
			m.cache = newSegmentCache(DefaultCacheBytes, 256)
			t, _ := m.RenderChat(prev)
			m.EncodeText(t, false)
			b.ResetTimer()
			for range b.N {
				t, _ := m.RenderChat(req)
				m.EncodeText(t, false)
			}
		})
		b.Run(fmt.Sprintf("family=%s/tokens=%d/render_only", fam, n), func(b *testing.B) {
			for range b.N {
				m.RenderChat(req)
			}
		})
	}
}
