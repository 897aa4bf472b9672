package tokenize

import (
	"path/filepath"
	"testing"
)

// BenchmarkLoad measures LoadModel (tokenizer.json parse, vocabulary and merge tables).
func BenchmarkLoad(b *testing.B) {
	for _, fam := range []string{"qwen3", "llama3_1"} {
		b.Run("family="+fam, func(b *testing.B) {
			loadFamily(b, fam) // skip when absent
			for range b.N {
				if _, err := LoadModel(filepath.Join(tokenizersDir(), fam), Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
