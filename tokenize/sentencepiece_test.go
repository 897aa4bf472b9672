package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/request"
)

// TestMetaspaceExact checks the Metaspace pre-tokenizer (prepend_scheme first, always,
// never; split on and off) against Hugging Face's tokenizers: each variant is Llama
// 2's tokenizer.json with normalizer null and a Metaspace pre-tokenizer, built here and
// in testdata/gen/metaspace.js the same way.
func TestMetaspaceExact(t *testing.T) {
	loadFamily(t, "llama2") // skips (or fails under CI) without the files
	var corpus corpusFile
	readJSON(t, filepath.Join("testdata", "corpus.json"), &corpus)
	var g struct {
		Texts    []string              `json:"texts"`
		Variants map[string][][]uint32 `json:"variants"`
	}
	readJSON(t, filepath.Join("testdata", "golden", "llama2_metaspace.json"), &g)
	var texts []string
	for _, x := range corpus.Texts {
		texts = append(texts, x.Text)
	}
	for _, x := range corpus.MoreTexts {
		texts = append(texts, x.Text)
	}
	if len(texts) != len(g.Texts) {
		t.Fatalf("golden has %d texts, corpus %d: regenerate (make tokenizer-goldens)", len(g.Texts), len(texts))
	}
	base, err := os.ReadFile(filepath.Join(tokenizersDir(), "llama2", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	schemes := map[string][2]any{"first": {"first", true}, "always": {"always", true}, "never_nosplit": {"never", false}}
	if len(g.Variants) != len(schemes) {
		t.Fatalf("golden has %d variants, want %d", len(g.Variants), len(schemes))
	}
	for name, want := range g.Variants {
		t.Run(name, func(t *testing.T) {
			var tok map[string]json.RawMessage
			if err := json.Unmarshal(base, &tok); err != nil {
				t.Fatal(err)
			}
			sc := schemes[name]
			tok["normalizer"] = json.RawMessage("null")
			tok["pre_tokenizer"], _ = json.Marshal(map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": sc[0], "split": sc[1]})
			dir := t.TempDir()
			b, _ := json.Marshal(tok)
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := LoadModel(dir, Options{CacheBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			for i, ids := range want {
				if got := m.EncodeText(texts[i], false); firstDiff(got, ids) >= 0 {
					t.Errorf("text %s: first difference at %d\n got %v\nwant %v", g.Texts[i], firstDiff(got, ids), got, ids)
				}
			}
		})
	}
}

// writeTinySP writes a small SentencePiece-style tokenizer.json: characters ▁ a b c,
// merges a+b→"ab", ▁+ab→"▁ab", byte tokens <0x00>…<0xFF>, <unk>, <s>; edit may change
// it before writing.
func writeTinySP(t testing.TB, dir string, edit func(tok map[string]any)) {
	t.Helper()
	vocab := map[string]any{"<unk>": 0, "<s>": 1}
	for b := 0; b < 256; b++ {
		vocab[byteToken(b)] = 2 + b
	}
	for i, s := range []string{"▁", "a", "b", "c", "ab", "▁ab"} {
		vocab[s] = 300 + i
	}
	tok := map[string]any{
		"added_tokens": []any{map[string]any{"id": 1, "content": "<s>", "special": true, "normalized": false}},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}},
		"pre_tokenizer":  nil,
		"post_processor": nil,
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{"a b", "▁ ab"},
			"byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>"},
	}
	if edit != nil {
		edit(tok)
	}
	os.MkdirAll(dir, 0o755)
	b, _ := json.Marshal(tok)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func byteToken(b int) string {
	const hex = "0123456789ABCDEF"
	return "<0x" + string(hex[b>>4]) + string(hex[b&15]) + ">"
}

func TestTinySentencePiece(t *testing.T) {
	dir := t.TempDir()
	writeTinySP(t, dir, nil)
	m, err := LoadModel(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// "ab c" → "▁ab▁c": ▁ab, ▁, c. "é" is not in the vocabulary: bytes C3 A9.
	// "<s>" splits the text; each run is normalized on its own (Prepend again).
	cases := []struct {
		in   string
		want []uint32
	}{
		{"ab c", []uint32{305, 300, 303}},
		{"é", []uint32{300, 2 + 0xC3, 2 + 0xA9}},
		{"ab<s>ab", []uint32{305, 1, 305}},
		{"", nil},
	}
	for _, c := range cases {
		if got := m.EncodeText(c.in, false); firstDiff(got, c.want) >= 0 {
			t.Errorf("EncodeText(%q) = %v, want %v", c.in, got, c.want)
		}
	}

	// Without byte_fallback an unknown character is <unk>, fused with its neighbours.
	dir2 := t.TempDir()
	writeTinySP(t, dir2, func(tok map[string]any) {
		tok["model"].(map[string]any)["byte_fallback"] = false
	})
	m2, err := LoadModel(dir2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m2.EncodeText("aéüb", false), []uint32{300, 301, 0, 302}; firstDiff(got, want) >= 0 {
		t.Errorf("fused unk: %v, want %v", got, want)
	}
}

func TestSentencePieceRefusals(t *testing.T) {
	for name, edit := range map[string]func(tok map[string]any){
		"regex replace": func(tok map[string]any) {
			tok["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": "▁"}
		},
		"unknown normalizer": func(tok map[string]any) { tok["normalizer"] = map[string]any{"type": "NFKC"} },
		"split with spaces left": func(tok map[string]any) {
			tok["normalizer"] = nil
			tok["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "MergedWithPrevious"}
		},
		"missing byte token": func(tok map[string]any) {
			delete(tok["model"].(map[string]any)["vocab"].(map[string]any), "<0x7F>")
		},
		"normalized added token": func(tok map[string]any) {
			tok["added_tokens"] = []any{map[string]any{"id": 1, "content": "<s>", "special": true, "normalized": true}}
		},
		"metaspace scheme": func(tok map[string]any) {
			tok["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeTinySP(t, dir, edit)
			if _, err := LoadModel(dir, Options{}); !errors.Is(err, ErrUnsupported) {
				t.Errorf("LoadModel: %v, want ErrUnsupported", err)
			}
		})
	}
}

// TestSentencePieceCut checks on Gemma 3's and Llama 2's vocabularies that cutting a
// word before "▁" (spVocab.cut) gives the ids of merging the whole word, for every
// corpus text (Gemma has one token across a cut point, ">▁</").
func TestSentencePieceCut(t *testing.T) {
	var corpus corpusFile
	readJSON(t, filepath.Join("testdata", "corpus.json"), &corpus)
	texts := []string{"a>▁</b ▁▁x▁ >▁< <0x41>▁<", "x  >  </ y"}
	for _, x := range corpus.Texts {
		texts = append(texts, x.Text)
	}
	for _, x := range corpus.MoreTexts {
		texts = append(texts, x.Text)
	}
	for _, fam := range []string{"gemma3", "llama2"} {
		m := loadFamily(t, fam)
		for _, s := range texts {
			checkCut(t, m, s)
		}
	}
}

func checkCut(t *testing.T, m *Model, s string) {
	t.Helper()
	w := m.sp.normalize(s, true)
	cut := m.bpe.encodeSPRun(nil, w)
	whole := m.bpe.encodeSP(nil, w)
	if d := firstDiff(cut, whole); d >= 0 {
		t.Fatalf("%s: %q: cut and whole differ at %d\n  cut %v\nwhole %v", m.Dir, s, d, cut, whole)
	}
}

// FuzzSentencePieceCut is TestSentencePieceCut's property on a small vocabulary with
// tokens across cut points (">▁", ">▁<", "ab▁") and byte fallback.
func FuzzSentencePieceCut(f *testing.F) {
	for _, s := range []string{"ab ab", " >  < ab  c", "é>▁<", "ab▁▁", ">", "▁▁▁", "a\xffb ab"} {
		f.Add(s)
	}
	dir := f.TempDir()
	writeTinySP(f, dir, func(tok map[string]any) {
		md := tok["model"].(map[string]any)
		v := md["vocab"].(map[string]any)
		for i, s := range []string{">", "<", ">▁", ">▁<", "▁▁", "ab▁", "▁ab▁"} {
			v[s] = 400 + i
		}
		md["merges"] = []any{"a b", "> ▁", "▁ ▁", ">▁ <", "ab ▁", "▁ ab", "▁ab ▁"}
	})
	m, err := LoadModel(dir, Options{CacheBytes: -1})
	if err != nil {
		f.Fatal(err)
	}
	if !m.bpe.sp.cut || !m.bpe.sp.cross['>'] || !m.bpe.sp.cross['b'] {
		f.Fatalf("tiny vocabulary: cut %v cross %v", m.bpe.sp.cut, m.bpe.sp.cross)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return
		}
		checkCut(t, m, s)
	})
}

// TestGemmaRoleErrorGoesToWorker: Gemma's template raises on roles that do not
// alternate, as it does in vLLM (HTTP 400). kvroute's local path fails with
// template_error, the worker's /tokenize answers 400 (client_error: no backoff), and
// the request is routed on load so that the worker gives the client its own 400.
func TestGemmaRoleErrorGoesToWorker(t *testing.T) {
	m := loadFamily(t, "gemma3")
	w := newFakeWorker(t)
	w.mode.Store("400")
	ms := metrics.NewUnregistered().Tokenize
	s, err := NewService(ServiceOptions{Models: []ModelConfig{{Name: "gemma", Model: m}}, Metrics: ms,
		Address: func(string) (string, bool) { return w.addr(), true }})
	if err != nil {
		t.Fatal(err)
	}
	req, err := request.Parse(request.APIChat, []byte(`{"model":"gemma","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		res, _ := s.Tokenize(context.Background(), req)
		if res.Path != PathNone || res.Degraded != "remote_"+ReasonClient {
			t.Fatalf("role error: %+v, want degraded remote_client_error", res)
		}
	}
	if got := testutil.ToFloat64(ms.Failures.WithLabelValues("gemma", "local", ReasonTemplate)); got != 4 {
		t.Errorf("failures{local,template_error} = %v, want 4", got)
	}
	if w.calls.Load() != 4 {
		t.Errorf("worker asked %d times, want 4 (a client error starts no backoff)", w.calls.Load())
	}
	ok, _ := request.Parse(request.APIChat, []byte(`{"model":"gemma","messages":[{"role":"user","content":"a"}]}`))
	if res, _ := s.Tokenize(context.Background(), ok); res.Path != PathLocal || res.Tokens[0] != 2 {
		t.Errorf("alternating roles: %+v, want the local path starting with <bos>", res)
	}
}
