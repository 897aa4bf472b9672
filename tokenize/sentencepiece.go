package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// SentencePiece-style BPE, as tokenizer.json stores the models converted from a
// SentencePiece .model (Llama 2, Mistral, Gemma 2/3): the vocabulary is literal text
// in which "▁" (U+2581) stands for a space, the initial symbols of a word are its
// characters (not its bytes), and a character missing from the vocabulary becomes its
// UTF-8 bytes as the tokens "<0xNN>" (byte_fallback) or the unknown token.
// Sources: tokenizers/src/models/bpe/model.rs (merge_word, byte_fallback, fuse_unk),
// normalizers/{replace,prepend}.rs, pre_tokenizers/metaspace.rs (prepend_scheme),
// pre_tokenizers/split.rs.

// spaceMark is SentencePiece's visible space, U+2581 LOWER ONE EIGHTH BLOCK.
const spaceMark = "▁"

// normOp is one normalizer step of a Sequence: NFC, Replace(String) or Prepend.
type normOp struct {
	kind     byte // 'c' NFC, 'r' Replace, 'p' Prepend
	from, to string
}

// spText is the SentencePiece text pipeline of a model: its normalizer steps and its
// Metaspace pre-tokenizer, if any.
type spText struct {
	ops []normOp
	// metaspace is set for a Metaspace pre-tokenizer: ' ' is replaced by replacement,
	// the prefix is added per prependScheme and, with split, the text is cut before
	// every replacement character (MergedWithNext).
	metaspace     bool
	replacement   string
	prependScheme string // "always", "first", "never"
	split         bool
}

// buildNormalizerOps flattens a normalizer into its steps: null, NFC, Replace with a
// String pattern, Prepend and (nested) Sequences of them.
func buildNormalizerOps(raw json.RawMessage, ops []normOp) ([]normOp, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return ops, nil
	}
	var t struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Pattern     struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		} `json:"pattern"`
		Content string `json:"content"`
		Prepend string `json:"prepend"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("%w: normalizer: %v", ErrUnsupported, err)
	}
	switch t.Type {
	case "NFC":
		return append(ops, normOp{kind: 'c'}), nil
	case "Replace":
		if t.Pattern.String == nil || *t.Pattern.String == "" {
			return nil, fmt.Errorf("%w: Replace normalizer %s (only a String pattern)", ErrUnsupported, short(raw))
		}
		return append(ops, normOp{kind: 'r', from: *t.Pattern.String, to: t.Content}), nil
	case "Prepend":
		return append(ops, normOp{kind: 'p', to: t.Prepend}), nil
	case "Sequence":
		var err error
		for _, n := range t.Normalizers {
			if ops, err = buildNormalizerOps(n, ops); err != nil {
				return nil, err
			}
		}
		return ops, nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, t.Type)
}

// spacesGone reports whether the normalizer leaves no ' ' in any text: a Replace of
// " " by text without a space, after which no step adds one.
func spacesGone(ops []normOp) bool {
	gone := false
	for _, op := range ops {
		switch op.kind {
		case 'r':
			if op.from == " " && !strings.Contains(op.to, " ") {
				gone = true
			} else if strings.Contains(op.to, " ") {
				gone = false
			}
		case 'p':
			if strings.Contains(op.to, " ") {
				gone = false
			}
		}
	}
	return gone
}

// buildSPText reads the normalizer and pre-tokenizer of a SentencePiece-style
// tokenizer.json: pre_tokenizer null, Metaspace, or Split(String " ",
// MergedWithPrevious) after a normalizer that has already replaced every space (a
// no-op, as in Gemma's files).
func buildSPText(normRaw, preRaw json.RawMessage) (*spText, error) {
	ops, err := buildNormalizerOps(normRaw, nil)
	if err != nil {
		return nil, err
	}
	sp := &spText{ops: ops}
	if len(preRaw) == 0 || string(preRaw) == "null" {
		return sp, nil
	}
	var p struct {
		Type          string            `json:"type"`
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
		Pattern       struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		} `json:"pattern"`
		Behavior       string  `json:"behavior"`
		Invert         bool    `json:"invert"`
		Replacement    string  `json:"replacement"`
		PrependScheme  string  `json:"prepend_scheme"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		Split          *bool   `json:"split"`
		StrRep         *string `json:"str_rep"`
	}
	if err := json.Unmarshal(preRaw, &p); err != nil {
		return nil, fmt.Errorf("%w: pre_tokenizer: %v", ErrUnsupported, err)
	}
	if p.Type == "Sequence" && len(p.PreTokenizers) == 1 {
		return buildSPText(normRaw, p.PreTokenizers[0])
	}
	switch p.Type {
	case "Split":
		if p.Pattern.String != nil && *p.Pattern.String == " " && !p.Invert && spacesGone(ops) {
			return sp, nil // the normalizer left no space to split on
		}
	case "Metaspace":
		if utf8.RuneCountInString(p.Replacement) != 1 {
			return nil, fmt.Errorf("%w: Metaspace replacement %q (one character expected)", ErrUnsupported, p.Replacement)
		}
		sp.metaspace, sp.replacement = true, p.Replacement
		sp.prependScheme = p.PrependScheme
		if sp.prependScheme == "" { // files written before prepend_scheme: add_prefix_space
			sp.prependScheme = "always"
			if p.AddPrefixSpace != nil && !*p.AddPrefixSpace {
				sp.prependScheme = "never"
			}
		}
		switch sp.prependScheme {
		case "always", "first", "never":
		default:
			return nil, fmt.Errorf("%w: Metaspace prepend_scheme %q", ErrUnsupported, sp.prependScheme)
		}
		sp.split = p.Split == nil || *p.Split
		return sp, nil
	}
	return nil, fmt.Errorf("%w: pre_tokenizer %s for a SentencePiece-style BPE", ErrUnsupported, short(preRaw))
}

// hasNFC reports whether the normalizer includes NFC (added tokens with normalized
// true are then matched in NFC form).
func (sp *spText) hasNFC() bool {
	for _, op := range sp.ops {
		if op.kind == 'c' {
			return true
		}
	}
	return false
}

// changesText reports whether any step other than NFC is present (such a normalizer
// would also rewrite normalized added tokens, which is not implemented).
func (sp *spText) changesText() bool {
	for _, op := range sp.ops {
		if op.kind != 'c' {
			return true
		}
	}
	return false
}

// normalize applies the normalizer steps to one text run between added tokens, then
// the Metaspace replacement and prefix. atStart says whether the run starts at byte 0
// of the input (Metaspace prepend_scheme "first").
func (sp *spText) normalize(s string, atStart bool) string {
	for _, op := range sp.ops {
		switch op.kind {
		case 'c':
			if !isASCII(s) {
				s = norm.NFC.String(s)
			}
		case 'r':
			s = strings.ReplaceAll(s, op.from, op.to)
		case 'p':
			if s != "" { // normalizers/prepend.rs: empty text stays empty
				s = op.to + s
			}
		}
	}
	if sp.metaspace && s != "" {
		s = strings.ReplaceAll(s, " ", sp.replacement)
		if !strings.HasPrefix(s, sp.replacement) {
			if sp.prependScheme == "always" || (sp.prependScheme == "first" && atStart) {
				s = sp.replacement + s
			}
		}
	}
	return s
}

// words calls fn with each pre-token of a normalized run: the whole run, or with
// Metaspace split the pieces that each begin at a replacement character.
func (sp *spText) words(s string, fn func(string)) {
	if !sp.metaspace || !sp.split {
		fn(s)
		return
	}
	if s == "" {
		return
	}
	start := 0 // start < len(s) throughout
	for {
		j := strings.Index(s[start+1:], sp.replacement)
		if j < 0 {
			break
		}
		fn(s[start : start+1+j])
		start += 1 + j
	}
	fn(s[start:])
}

// spVocab holds what merge_word needs of a SentencePiece-style vocabulary.
type spVocab struct {
	ascii   [128]int64        // id of each one-character ASCII token, -1 if absent
	chars   map[rune]uint32   // ids of the other one-character tokens
	unk     uint32            // the unknown token's id, when hasUnk
	hasUnk  bool              //
	fuseUnk bool              // consecutive unknown characters become one unknown token
	bytes   bool              // byte_fallback with all 256 <0xNN> tokens
	words   map[string]uint32 // whole-vocabulary lookup for ignore_merges
	// cut is set when a word may be cut before each "▁" that follows a character c
	// with a token of its own and in no token followed by "▁" (cross holds those
	// that are): no merge can then produce a symbol across the cut, so merging the
	// pieces apart gives the same ids as merging the whole word, in far less time
	// (Gemma and legacy Llama 2 files have no pre-tokenizer: a text run is one word).
	cut   bool
	cross map[rune]bool
}

// encodeSPRun encodes one pre-token, cut into independent pieces where no merge can
// cross (see spVocab.cut).
func (m *bpe) encodeSPRun(dst []uint32, w string) []uint32 {
	v := m.sp
	if !v.cut {
		return m.encodeSP(dst, w)
	}
	start, i := 0, 0
	for {
		j := strings.Index(w[i:], spaceMark)
		if j < 0 {
			break
		}
		p := i + j
		if p > start {
			r, _ := utf8.DecodeLastRuneInString(w[:p])
			if r != '▁' && v.has(r) && !v.cross[r] {
				dst = m.encodeSP(dst, w[start:p])
				start = p
			}
		}
		i = p + len(spaceMark)
	}
	return m.encodeSP(dst, w[start:])
}

// has reports whether character r has a token of its own.
func (v *spVocab) has(r rune) bool {
	if r < utf8.RuneSelf {
		return v.ascii[r] >= 0
	}
	if r == utf8.RuneError {
		return false // an invalid byte, or U+FFFD: let the whole word decide
	}
	_, ok := v.chars[r]
	return ok
}

// encodeSP appends the ids of one SentencePiece pre-token to dst: merge_word's
// initial symbols (characters, byte-fallback tokens, unknown), then the merges.
func (m *bpe) encodeSP(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	v := m.sp
	if m.ignoreMerges {
		if id, ok := v.words[w]; ok {
			return append(dst, id)
		}
	}
	var buf [48]uint32
	syms := buf[:0]
	unkOpen := false
	for i := 0; i < len(w); {
		var id uint32
		found := false
		r, size := rune(w[i]), 1
		if r < utf8.RuneSelf {
			if x := v.ascii[r]; x >= 0 {
				id, found = uint32(x), true
			}
		} else {
			r, size = utf8.DecodeRuneInString(w[i:])
			if size > 1 { // an invalid byte (size 1) has no character token
				id, found = v.chars[r]
			}
		}
		switch {
		case found:
			unkOpen = false
			syms = append(syms, id)
		case v.bytes:
			// The unknown token pending before this one is not flushed here in
			// model.rs either; with all 256 byte tokens there is never one.
			for k := i; k < i+size; k++ {
				syms = append(syms, m.byteID[w[k]])
			}
		case v.hasUnk:
			if !(unkOpen && v.fuseUnk) {
				syms = append(syms, v.unk)
			}
			unkOpen = true
		}
		i += size
	}
	if len(syms) <= len(buf) {
		return m.mergeSmall(dst, syms)
	}
	return m.mergeHeap(dst, syms)
}

// buildSPVocab fills the SentencePiece lookup tables of b from the vocabulary.
func buildSPVocab(b *bpe, vocab map[string]uint32, unk *string, byteFallback, fuseUnk bool) error {
	v := &spVocab{chars: map[rune]uint32{}, fuseUnk: fuseUnk}
	for i := range v.ascii {
		v.ascii[i] = -1
	}
	if b.ignoreMerges {
		v.words = vocab
	}
	v.cross = map[rune]bool{}
	_, haveMark := vocab[spaceMark]
	v.cut = haveMark && !b.ignoreMerges
	for tok, id := range vocab {
		for k := 1; k < len(tok); k++ {
			if strings.HasPrefix(tok[k:], spaceMark) {
				if r, _ := utf8.DecodeLastRuneInString(tok[:k]); r != '▁' {
					v.cross[r] = true
				}
			}
		}
		r, size := utf8.DecodeRuneInString(tok)
		if size != len(tok) || (r == utf8.RuneError && size <= 1) {
			continue
		}
		if r < utf8.RuneSelf {
			v.ascii[r] = int64(id)
		} else {
			v.chars[r] = id
		}
	}
	if unk != nil && *unk != "" {
		id, ok := vocab[*unk]
		if !ok {
			return fmt.Errorf("%w: unk_token %q is not in the vocabulary", ErrUnsupported, *unk)
		}
		v.unk, v.hasUnk = id, true
	}
	if byteFallback {
		for c := 0; c < 256; c++ {
			id, ok := vocab[fmt.Sprintf("<0x%02X>", c)]
			if !ok {
				return fmt.Errorf("%w: byte_fallback vocabulary lacks <0x%02X>", ErrUnsupported, c)
			}
			b.byteID[c] = id
		}
		v.bytes = true
	}
	b.sp = v
	return nil
}
