package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/request"
)

const cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// writeTiny writes a small byte-level BPE tokenizer.json (ids 0-255 are the bytes in
// byte-level form; merges h+e→256, l+l→257, he+ll→258, Ġ+w→259; added <s>=300 and
// <|end|>=301) and a tokenizer_config.json; edit may change both before writing.
func writeTiny(t *testing.T, dir string, edit func(tok, cfg map[string]any)) {
	t.Helper()
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["he"] = 256
	vocab["ll"] = 257
	vocab["hell"] = 258
	vocab["Ġw"] = 259
	tok := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 300, "content": "<s>", "special": true, "normalized": false},
			map[string]any{"id": 301, "content": "<|end|>", "special": true, "normalized": false},
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kPattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []any{300}}}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{"h e", "l l", "he ll", "Ġ w"}},
	}
	cfg := map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|end|>",
		"chat_template": "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<s>assistant:{% endif %}"}
	if edit != nil {
		edit(tok, cfg)
	}
	os.MkdirAll(dir, 0o755)
	for name, v := range map[string]any{"tokenizer.json": tok, "tokenizer_config.json": cfg} {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTinyTokenizer(t *testing.T) {
	dir := t.TempDir()
	writeTiny(t, dir, nil)
	m, err := LoadModel(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// "hello" → "hell" (258) + "o"; " world" → "Ġw" (259) + bytes; "<|end|>" split out.
	got := m.EncodeText("hello world<|end|>", true)
	want := []uint32{300, 258, 'o', 259, 'o', 'r', 'l', 'd', 301}
	if firstDiff(got, want) >= 0 {
		t.Fatalf("EncodeText = %v, want %v (BOS from TemplateProcessing, merges by rank, added token split out)", got, want)
	}
	r, _ := request.Parse(request.APIChat, []byte(`{"model":"x","messages":[{"role":"user","content":"hello"}]}`))
	text, err := m.RenderChat(r)
	if err != nil || text != "<s>user: hello<|end|><s>assistant:" {
		t.Fatalf("RenderChat = %q, %v", text, err)
	}
}

func TestHubCacheLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "models--org--tiny")
	writeTiny(t, filepath.Join(root, "snapshots", "aaa"), nil)
	writeTiny(t, filepath.Join(root, "snapshots", "bbb"), nil)
	os.MkdirAll(filepath.Join(root, "refs"), 0o755)
	os.WriteFile(filepath.Join(root, "refs", "main"), []byte("aaa\n"), 0o644)
	m, err := LoadModel(root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(m.Dir) != "aaa" {
		t.Errorf("hub cache: loaded %s, want the snapshot refs/main names (aaa)", m.Dir)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := LoadModel(filepath.Join(t.TempDir(), "none"), Options{}); !errors.Is(err, ErrNoTokenizer) {
		t.Errorf("missing directory: %v, want ErrNoTokenizer", err)
	}
	cases := map[string]func(tok, cfg map[string]any){
		"unknown split pattern": func(tok, _ map[string]any) {
			tok["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = map[string]any{"Regex": `\w+`}
		},
		"unigram model":  func(tok, _ map[string]any) { tok["model"].(map[string]any)["type"] = "Unigram" },
		"byte fallback":  func(tok, _ map[string]any) { tok["model"].(map[string]any)["byte_fallback"] = true },
		"NFKC":           func(tok, _ map[string]any) { tok["normalizer"] = map[string]any{"type": "NFKC"} },
		"lstrip token":   func(tok, _ map[string]any) { tok["added_tokens"].([]any)[0].(map[string]any)["lstrip"] = true },
		"bad merge":      func(tok, _ map[string]any) { tok["model"].(map[string]any)["merges"] = []any{"x y"} },
		"post processor": func(tok, _ map[string]any) { tok["post_processor"] = map[string]any{"type": "RobertaProcessing"} },
	}
	for name, edit := range cases {
		dir := t.TempDir()
		writeTiny(t, dir, edit)
		if _, err := LoadModel(dir, Options{}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported (never guess ids)", name, err)
		}
	}
	// A template the engine cannot compile is reported at load time; text still works.
	dir := t.TempDir()
	writeTiny(t, dir, func(_, cfg map[string]any) { cfg["chat_template"] = "{% for m in messages %}{{ m.content " })
	m, err := LoadModel(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(m.ChatError(), ErrTemplate) {
		t.Errorf("broken template: ChatError = %v, want ErrTemplate", m.ChatError())
	}
	r, _ := request.Parse(request.APIChat, []byte(`{"model":"x","messages":[{"role":"user","content":"hello"}]}`))
	if _, err := m.RenderChat(r); !errors.Is(err, ErrTemplate) {
		t.Errorf("RenderChat with a broken template: %v", err)
	}
	// No template at all.
	dir = t.TempDir()
	writeTiny(t, dir, func(_, cfg map[string]any) { delete(cfg, "chat_template") })
	m, _ = LoadModel(dir, Options{})
	if _, err := m.RenderChat(r); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v, want ErrNoTemplate", err)
	}
	// raise_exception in the template surfaces as ErrTemplate.
	dir = t.TempDir()
	writeTiny(t, dir, func(_, cfg map[string]any) {
		cfg["chat_template"] = "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('no tool first') }}{% endif %}ok"
	})
	m, _ = LoadModel(dir, Options{})
	rt, _ := request.Parse(request.APIChat, []byte(`{"model":"x","messages":[{"role":"tool","content":"x"}]}`))
	if _, err := m.RenderChat(rt); !errors.Is(err, ErrTemplate) {
		t.Errorf("raise_exception: %v, want ErrTemplate", err)
	}
}

// TestGemmaLoads: Gemma 3 (SentencePiece-style BPE, byte_fallback) loads with its chat
// template; its ids are checked against the goldens in TestExactness.
func TestGemmaLoads(t *testing.T) {
	m := loadFamily(t, "gemma3")
	if err := m.ChatError(); err != nil {
		t.Errorf("gemma3 chat template: %v", err)
	}
	if m.bpe.sp == nil || m.sp == nil {
		t.Errorf("gemma3 loaded as byte-level BPE")
	}
}
