package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/request"
)

// families are the model families whose exactness is checked against goldens.
// gemma3 and llama2 are SentencePiece-style BPE (byte_fallback, ▁).
var families = []string{"qwen3", "llama3", "llama3_1", "deepseek_v3", "gptoss", "gemma3", "llama2"}

// tokenizersDir is where scripts/fetch-tokenizers.sh puts the real tokenizer files.
func tokenizersDir() string { return filepath.Join("..", ".cache", "tokenizers") }

var (
	modelsMu sync.Mutex
	models   = map[string]*Model{}
)

// loadFamily loads .cache/tokenizers/<family> once per test binary. Without the files it
// skips, unless CI is set: under CI (make test fetches them first) it fails.
func loadFamily(tb testing.TB, fam string) *Model {
	tb.Helper()
	dir := filepath.Join(tokenizersDir(), fam)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("%s/tokenizer.json missing under CI: run scripts/fetch-tokenizers.sh (make test does)", dir)
		}
		tb.Skipf("%s/tokenizer.json missing: run scripts/fetch-tokenizers.sh (make tokenizers) to test family %s", dir, fam)
	}
	modelsMu.Lock()
	defer modelsMu.Unlock()
	if m, ok := models[fam]; ok {
		return m
	}
	m, err := LoadModel(dir, Options{})
	if err != nil {
		tb.Fatalf("LoadModel(%s): %v", dir, err)
	}
	models[fam] = m
	return m
}

type corpusFile struct {
	Texts []struct {
		Name string `json:"name"`
		Text string `json:"text"`
	} `json:"texts"`
	MoreTexts []struct {
		Name string `json:"name"`
		Text string `json:"text"`
	} `json:"more_texts"`
	Long  []string `json:"long"`
	Chats []struct {
		Name    string          `json:"name"`
		Request json.RawMessage `json:"request"`
	} `json:"chats"`
}

type goldenFile struct {
	Family string `json:"family"`
	Texts  []struct {
		Name    string   `json:"name"`
		Special []uint32 `json:"special"`
		Plain   []uint32 `json:"plain"`
	} `json:"texts"`
	// MoreTexts are corpus.json's more_texts (absent from goldens written before it).
	MoreTexts []struct {
		Name    string   `json:"name"`
		Special []uint32 `json:"special"`
		Plain   []uint32 `json:"plain"`
	} `json:"more_texts"`
	Long []struct {
		Name   string   `json:"name"`
		Count  int      `json:"count"`
		SHA256 string   `json:"sha256"`
		Head   []uint32 `json:"head"`
	} `json:"long"`
	Chats []struct {
		Name  string   `json:"name"`
		Text  string   `json:"text"`
		IDs   []uint32 `json:"ids"`
		Error string   `json:"error"`
	} `json:"chats"`
}

func readJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
}

// chatRequest parses a corpus chat body as a /v1/chat/completions request.
func chatRequest(tb testing.TB, body json.RawMessage) *request.Request {
	tb.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		tb.Fatal(err)
	}
	m["model"] = json.RawMessage(`"m"`)
	b, _ := json.Marshal(m)
	r, err := request.Parse(request.APIChat, b)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
