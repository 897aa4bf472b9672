package request

import (
	"bytes"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// A 14 MB /v1/completions body of 7 M token ids is refused while it is parsed, with a
// 400 that says why, having allocated a bounded tree: before, the whole array became
// ~7 M JSON values (about 2 GB of RSS through the proxy) and only then met
// router.max_prompt_tokens.
func TestTokenIDPromptBoundedWhileParsing(t *testing.T) {
	const ids, bound = 7_000_000, 131072
	var b bytes.Buffer
	b.Grow(ids*2 + 64)
	b.WriteString(`{"model":"m","prompt":[`)
	for i := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('7')
	}
	b.WriteString(`]}`)
	body := b.Bytes()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ParseBounded(APICompletions, body, bound)
	runtime.ReadMemStats(&after)
	e, ok := AsError(err)
	if !ok || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "more than 131072 elements") {
		t.Fatalf("7 M token ids: %v, want a 400 naming the bound", err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	// The elements kept before the refusal (≤ bound, ~80 bytes each, the stack grown by
	// doubling) and nothing per id beyond them.
	if alloc > 64<<20 {
		t.Fatalf("refusing 7 M ids allocated %d MB; want at most the bound's elements", alloc>>20)
	}
	t.Logf("refused 7 M ids (%d MB body) after allocating %.1f MB", len(body)>>20, float64(alloc)/(1<<20))

	// At the bound it parses.
	ok2 := []byte(`{"model":"m","prompt":[` + strings.Repeat("7,", bound-1) + `7]}`)
	r, err := ParseBounded(APICompletions, ok2, bound)
	if err != nil || len(r.PromptTokenIDs) != 1 || len(r.PromptTokenIDs[0]) != bound {
		t.Fatalf("a prompt of exactly %d ids: %v", bound, err)
	}
	// Parse's own default bound refuses it too, above any real context length.
	if _, err := Parse(APICompletions, body); err == nil {
		t.Fatal("Parse accepted 7 M token ids")
	}
}
