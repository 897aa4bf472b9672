package request

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParse is request.Parse alone on chat bodies of ~4, 64 and 220 KB (the
// sizes of BenchmarkExtProcOverhead), to separate parsing from the ext_proc path.
func BenchmarkParse(b *testing.B) {
	turn := strings.Repeat("lorem ipsum dolor sit amet ", 38)
	for _, size := range []int{4 << 10, 64 << 10, 220 << 10} {
		var sb strings.Builder
		sb.WriteString(`{"model":"m","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."}`)
		for i := 0; sb.Len() < size-64; i++ {
			fmt.Fprintf(&sb, `,{"role":"user","content":%q}`, turn)
		}
		sb.WriteString(`]}`)
		body := []byte(sb.String())
		b.Run(fmt.Sprintf("body=%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Parse(APIChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
