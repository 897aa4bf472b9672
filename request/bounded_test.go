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
	// The ids kept before the refusal (≤ bound, 4 bytes each, counted before they are
	// allocated) and nothing per id beyond them: 0.5 MB; as a tree of Values it was ~42 MB.
	if alloc > 2<<20 {
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

// A token-id prompt costs its ids (4 bytes each) to parse, not a Value per id: 1 M ids
// in one list or split in lists allocate at most 8 bytes per id (the tree of Values
// allocated ~386 bytes per id; BenchmarkParseTokenIDs reports B/id), and read back as
// written. Lists that are not all plain uint32s keep the tree's answers.
func TestTokenIDPromptCompact(t *testing.T) {
	const n = 1 << 20
	for _, lists := range []int{1, 4} {
		body := tokenIDBody(n)
		if lists > 1 {
			s := strings.Replace(string(body), `"prompt":[`, `"prompt":[[`, 1)
			s = strings.Replace(s, `]}`, `]]}`, 1)
			for k, at := 1, 0; k < lists; k++ { // cut into lists at every n/lists-th comma
				for c := 0; c < n/lists; c++ {
					at += strings.IndexByte(s[at+1:], ',') + 1
				}
				s = s[:at] + "],[" + s[at+1:]
			}
			body = []byte(s)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r, err := Parse(APICompletions, body)
		runtime.ReadMemStats(&after)
		if err != nil || len(r.PromptTokenIDs) != lists {
			t.Fatalf("%d lists: %v", lists, err)
		}
		k := 0
		for _, ids := range r.PromptTokenIDs {
			for _, id := range ids {
				if want := uint32((k * 7919) % 151_000); id != want {
					t.Fatalf("id %d = %d, want %d", k, id, want)
				}
				k++
			}
		}
		if k != n {
			t.Fatalf("%d lists: %d ids, want %d", lists, k, n)
		}
		if per := float64(after.TotalAlloc-before.TotalAlloc) / n; per > 8 {
			t.Fatalf("%d lists: parsing allocated %.1f bytes per id, want ≤ 8", lists, per)
		}
	}
	for _, bad := range []string{`[1,-1]`, `[1,2.0]`, `[1,4294967296]`, `[1,"a"]`, `[[1],[2,1e2]]`, `[[1],[]]`} {
		if _, err := Parse(APICompletions, []byte(`{"model":"m","prompt":`+bad+`}`)); err == nil {
			t.Errorf("prompt %s accepted", bad)
		}
	}
}
