package tokenize

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/request"
)

func idsDigest(ids []uint32) string {
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, id)
	}
	h := sha256.Sum256([]byte(sb.String()))
	return hex.EncodeToString(h[:])
}

// TestExactness compares every corpus text and chat with the golden ids produced by
// Hugging Face's tokenizers core and jinja2 (testdata/gen): every id must match, for
// every family, or prefix-cache keys would diverge from the engine's.
func TestExactness(t *testing.T) {
	var corpus corpusFile
	readJSON(t, filepath.Join("testdata", "corpus.json"), &corpus)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			var g goldenFile
			readJSON(t, filepath.Join("testdata", "golden", fam+".json"), &g)
			m := loadFamily(t, fam)
			if len(g.Texts) != len(corpus.Texts) {
				t.Fatalf("golden has %d texts, corpus %d: regenerate with make tokenizer-goldens", len(g.Texts), len(corpus.Texts))
			}
			for i, want := range g.Texts {
				text := corpus.Texts[i].Text
				for _, special := range []bool{false, true} {
					exp := want.Plain
					if special {
						exp = want.Special
					}
					got := m.EncodeText(text, special)
					if d := firstDiff(got, exp); d >= 0 {
						t.Errorf("text %s (add_special_tokens=%v): first difference at %d\n got %v\nwant %v", want.Name, special, d, got, exp)
					}
				}
			}
			if len(g.MoreTexts) > len(corpus.MoreTexts) {
				t.Fatalf("golden has %d more_texts, corpus %d", len(g.MoreTexts), len(corpus.MoreTexts))
			}
			for i, want := range g.MoreTexts {
				text := corpus.MoreTexts[i].Text
				if got := m.EncodeText(text, true); firstDiff(got, want.Special) >= 0 {
					t.Errorf("more text %s (add_special_tokens=true): first difference at %d\n got %v\nwant %v", want.Name, firstDiff(got, want.Special), got, want.Special)
				}
				if got := m.EncodeText(text, false); firstDiff(got, want.Plain) >= 0 {
					t.Errorf("more text %s: first difference at %d\n got %v\nwant %v", want.Name, firstDiff(got, want.Plain), got, want.Plain)
				}
			}
			for _, want := range g.Long {
				b, err := os.ReadFile(filepath.Join("testdata", want.Name))
				if err != nil {
					t.Fatal(err)
				}
				got := m.EncodeText(string(b), false)
				if len(got) != want.Count || idsDigest(got) != want.SHA256 {
					d := firstDiff(got[:min(len(got), len(want.Head))], want.Head)
					t.Errorf("long text %s: %d ids (want %d), digest differs; first difference in the head at %d", want.Name, len(got), want.Count, d)
				}
			}
			for _, want := range g.Chats {
				var req = chatRequestByName(t, &corpus, want.Name)
				text, err := m.RenderChat(req)
				if want.Error != "" {
					if err == nil {
						t.Errorf("chat %s: rendered, but the reference raised %q", want.Name, want.Error)
					}
					continue
				}
				if err != nil {
					t.Errorf("chat %s: %v", want.Name, err)
					continue
				}
				if text != want.Text {
					t.Errorf("chat %s: render differs\n got %q\nwant %q", want.Name, text, want.Text)
					continue
				}
				if d := firstDiff(m.EncodeText(text, false), want.IDs); d >= 0 {
					t.Errorf("chat %s: ids differ at %d", want.Name, d)
				}
			}
		})
	}
}

func chatRequestByName(t *testing.T, c *corpusFile, name string) *request.Request {
	for _, ch := range c.Chats {
		if ch.Name == name {
			return chatRequest(t, ch.Request)
		}
	}
	t.Fatalf("chat %s not in corpus", name)
	return nil
}
