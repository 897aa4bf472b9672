package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Sentinel errors. Errors returned by LoadModel and the encoders wrap one of these.
var (
	// ErrNoTokenizer: the directory has no tokenizer.json (or does not exist).
	ErrNoTokenizer = errors.New("tokenize: no tokenizer.json")
	// ErrUnsupported: tokenizer.json uses a model, normalizer, pre-tokenizer or
	// post-processor this package does not implement exactly. The model must then
	// use another path (the worker's /tokenize); never guess.
	ErrUnsupported = errors.New("tokenize: unsupported tokenizer")
	// ErrNoTemplate: the model has no chat template (chat requests cannot be rendered).
	ErrNoTemplate = errors.New("tokenize: no chat template")
	// ErrTemplate: the chat template failed to compile or render.
	ErrTemplate = errors.New("tokenize: chat template")
)

// tokenizerJSON is the part of tokenizer.json this package reads.
type tokenizerJSON struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string          `json:"type"`
		Dropout                 *float64        `json:"dropout"`
		UnkToken                *string         `json:"unk_token"`
		ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
		ByteFallback            bool            `json:"byte_fallback"`
		FuseUnk                 bool            `json:"fuse_unk"`
		IgnoreMerges            bool            `json:"ignore_merges"`
		Vocab                   json.RawMessage `json:"vocab"`
		Merges                  json.RawMessage `json:"merges"`
	} `json:"model"`
}

// ResolveDir finds the Hugging Face layout directory inside dir: dir itself when it
// holds tokenizer.json; for a Hugging Face hub cache entry (models--org--name) the
// snapshot named by refs/main, else the only (or newest-named) snapshot.
func ResolveDir(dir string) (string, error) {
	if fileExists(filepath.Join(dir, "tokenizer.json")) {
		return dir, nil
	}
	snaps := filepath.Join(dir, "snapshots")
	if ref, err := os.ReadFile(filepath.Join(dir, "refs", "main")); err == nil {
		d := filepath.Join(snaps, strings.TrimSpace(string(ref)))
		if fileExists(filepath.Join(d, "tokenizer.json")) {
			return d, nil
		}
	}
	ents, _ := os.ReadDir(snaps)
	var names []string
	for _, e := range ents {
		if e.IsDir() && fileExists(filepath.Join(snaps, e.Name(), "tokenizer.json")) {
			names = append(names, e.Name())
		}
	}
	if len(names) > 0 {
		sort.Strings(names)
		return filepath.Join(snaps, names[len(names)-1]), nil
	}
	return "", fmt.Errorf("%w in %s (nor in a Hugging Face cache snapshot below it)", ErrNoTokenizer, dir)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// usesByteLevel reports whether a pre_tokenizer has a ByteLevel component: such a
// tokenizer is byte-level BPE; one without is SentencePiece-style (sentencepiece.go).
func usesByteLevel(raw json.RawMessage) bool {
	var t struct {
		Type          string            `json:"type"`
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
	}
	if json.Unmarshal(raw, &t) != nil {
		return false
	}
	if t.Type == "ByteLevel" {
		return true
	}
	for _, p := range t.PreTokenizers {
		if usesByteLevel(p) {
			return true
		}
	}
	return false
}

// buildBPE checks that the model is a BPE this package computes exactly (byte-level,
// or SentencePiece-style when sentencePiece) and builds the merge table.
func buildBPE(t *tokenizerJSON, sentencePiece bool) (*bpe, error) {
	m := &t.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("%w: model type %q (only BPE)", ErrUnsupported, m.Type)
	case m.ByteFallback && !sentencePiece:
		return nil, fmt.Errorf("%w: byte-level BPE with byte_fallback", ErrUnsupported)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("%w: BPE dropout", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: BPE subword prefix/suffix", ErrUnsupported)
	}
	vocab := make(map[string]uint32, 1<<17)
	if err := scanVocab(m.Vocab, func(tok string, id uint32) { vocab[tok] = id }); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	b := &bpe{ignoreMerges: m.IgnoreMerges}
	if sentencePiece {
		if err := buildSPVocab(b, vocab, m.UnkToken, m.ByteFallback, m.FuseUnk); err != nil {
			return nil, err
		}
	} else if err := buildByteLevelVocab(b, vocab); err != nil {
		return nil, err
	}
	if err := buildMerges(b, m.Merges, vocab); err != nil {
		return nil, err
	}
	return b, nil
}

// buildByteLevelVocab fills the byte-level lookup tables of b.
func buildByteLevelVocab(b *bpe, vocab map[string]uint32) error {
	b.words = make(map[string]uint32, len(vocab))
	for tok, id := range vocab {
		raw, ok := decodeByteLevel(tok)
		if !ok {
			continue
		}
		b.words[string(raw)] = id
	}
	for c := 0; c < 256; c++ {
		id, ok := b.words[string([]byte{byte(c)})]
		if !ok {
			return fmt.Errorf("%w: vocabulary lacks the byte-level token for byte 0x%02x", ErrUnsupported, c)
		}
		b.byteID[c] = id
	}
	return nil
}

// buildMerges fills b's pair table from the merges list; rank = list position.
func buildMerges(b *bpe, raw json.RawMessage, vocab map[string]uint32) error {
	var merges [][3]uint32 // left, right, merged; index = rank
	var buf []byte
	err := scanMerges(raw, func(x, y string) error {
		a, ok1 := vocab[x]
		c, ok2 := vocab[y]
		buf = append(append(buf[:0], x...), y...)
		merged, ok3 := vocab[string(buf)]
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("%w: merge %d (%q, %q) names a token missing from the vocabulary", ErrUnsupported, len(merges), x, y)
		}
		merges = append(merges, [3]uint32{a, c, merged})
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrUnsupported) {
			err = fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return err
	}
	b.pairs = newPairTable(len(merges))
	for rank, mg := range merges {
		b.pairs.put(mg[0], mg[1], uint64(rank)<<32|uint64(mg[2]))
	}
	return nil
}

// typed is the "type" field every tokenizer.json component has.
type typed struct {
	Type string `json:"type"`
}

// buildNormalizer supports null, NFC and (nested) Sequences of them.
func buildNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var t struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return false, fmt.Errorf("%w: normalizer: %v", ErrUnsupported, err)
	}
	switch t.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		for _, n := range t.Normalizers {
			x, err := buildNormalizer(n)
			if err != nil {
				return false, err
			}
			nfc = nfc || x
		}
		return nfc, nil
	}
	return false, fmt.Errorf("%w: normalizer %q", ErrUnsupported, t.Type)
}

// buildPreTokenizer supports Sequence[Split(Regex, Isolated)…, ByteLevel(use_regex
// false, add_prefix_space false)] with the patterns in knownSplits.
func buildPreTokenizer(raw json.RawMessage) (*preTokenizer, error) {
	var t struct {
		Type          string            `json:"type"`
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
	}
	if err := json.Unmarshal(raw, &t); err != nil || t.Type != "Sequence" {
		return nil, fmt.Errorf("%w: pre_tokenizer %s (only Sequence of Split and ByteLevel)", ErrUnsupported, short(raw))
	}
	p := &preTokenizer{}
	byteLevel := false
	for _, r := range t.PreTokenizers {
		var c struct {
			Type    string `json:"type"`
			Pattern struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
			Behavior       string `json:"behavior"`
			Invert         bool   `json:"invert"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			UseRegex       bool   `json:"use_regex"`
		}
		if err := json.Unmarshal(r, &c); err != nil {
			return nil, fmt.Errorf("%w: pre_tokenizer: %v", ErrUnsupported, err)
		}
		switch {
		case c.Type == "Split" && !byteLevel:
			if c.Pattern.Regex == nil || c.Behavior != "Isolated" || c.Invert {
				return nil, fmt.Errorf("%w: Split pre-tokenizer %s (only Regex, Isolated, not inverted)", ErrUnsupported, short(r))
			}
			m, ok := knownSplits[*c.Pattern.Regex]
			if !ok {
				return nil, unsupportedPattern(*c.Pattern.Regex)
			}
			p.stages = append(p.stages, m)
		case c.Type == "ByteLevel" && !byteLevel:
			if c.AddPrefixSpace || c.UseRegex {
				return nil, fmt.Errorf("%w: ByteLevel pre-tokenizer with add_prefix_space or use_regex", ErrUnsupported)
			}
			byteLevel = true
		default:
			return nil, fmt.Errorf("%w: pre_tokenizer component %s", ErrUnsupported, short(r))
		}
	}
	if !byteLevel || len(p.stages) == 0 {
		return nil, fmt.Errorf("%w: pre_tokenizer without Split and a final ByteLevel", ErrUnsupported)
	}
	return p, nil
}

// postProcessor adds special tokens around a single sequence when add_special_tokens.
type postProcessor struct {
	before, after []uint32
}

// buildPostProcessor supports null, ByteLevel (no effect on ids), TemplateProcessing
// and Sequences of them.
func buildPostProcessor(raw json.RawMessage, pp *postProcessor) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var t struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return fmt.Errorf("%w: post_processor: %v", ErrUnsupported, err)
	}
	switch t.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		for _, p := range t.Processors {
			if err := buildPostProcessor(p, pp); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range t.Single {
			switch {
			case piece.Sequence != nil:
				seen = true
			case piece.SpecialToken != nil:
				st, ok := t.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("%w: TemplateProcessing names unknown special token %q", ErrUnsupported, piece.SpecialToken.ID)
				}
				if seen {
					pp.after = append(pp.after, st.IDs...)
				} else {
					pp.before = append(pp.before, st.IDs...)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("%w: post_processor %q", ErrUnsupported, t.Type)
}

func short(raw json.RawMessage) string {
	s := string(raw)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
