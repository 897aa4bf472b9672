package tokenize

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Pre-tokenization: the Split pre-tokenizers of tokenizer.json, with behaviour
// "Isolated", hand-written for the regular expressions the supported families use.
// Go's regexp has neither lookahead ((?!\S)) nor the leftmost-first backtracking
// alternation of Oniguruma, which Hugging Face tokenizers uses, so each pattern is a
// matcher that tries the alternatives in order at one position, the way a
// backtracking engine does. Each matcher's comment quotes its pattern; tests compare
// the result with the reference tokenizer on the corpus.

// matcher returns the end (exclusive, > i) of the pattern's match starting at byte i
// of s, or -1 when no alternative matches there.
type matcher func(s string, i int) int

// Character classes, as a bit set.
const (
	cL  uint16 = 1 << iota // \p{L}
	cN                     // \p{N}
	cWS                    // \s (Unicode White_Space)
	cP                     // \p{P}
	cS                     // \p{S}
	cM                     // \p{M}
	cLu                    // \p{Lu}
	cLl                    // \p{Ll}
	cLt                    // \p{Lt}
	cLm                    // \p{Lm}
	cLo                    // \p{Lo}
)

var asciiClass [128]uint16

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = slowClass(r)
	}
}

func slowClass(r rune) uint16 {
	var c uint16
	if unicode.IsLetter(r) {
		c |= cL
		switch {
		case unicode.Is(unicode.Lu, r):
			c |= cLu
		case unicode.Is(unicode.Ll, r):
			c |= cLl
		case unicode.Is(unicode.Lt, r):
			c |= cLt
		case unicode.Is(unicode.Lm, r):
			c |= cLm
		case unicode.Is(unicode.Lo, r):
			c |= cLo
		}
	}
	if unicode.IsNumber(r) {
		c |= cN
	}
	if unicode.IsSpace(r) {
		c |= cWS
	}
	if unicode.IsPunct(r) {
		c |= cP
	}
	if unicode.IsSymbol(r) {
		c |= cS
	}
	if unicode.IsMark(r) {
		c |= cM
	}
	return c
}

// at decodes the rune at byte i and returns it with its class and width. Past the end
// it returns class 0 and width 0.
func at(s string, i int) (rune, uint16, int) {
	if i >= len(s) {
		return -1, 0, 0
	}
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), asciiClass[b], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return r, slowClass(r), w
}

// runOf returns the end of the run of runes whose class intersects mask, from i.
func runOf(s string, i int, mask uint16) int {
	for i < len(s) {
		_, c, w := at(s, i)
		if c&mask == 0 {
			break
		}
		i += w
	}
	return i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i and returns its length in
// bytes, or 0. Case-insensitive matching uses simple case folding, under which 's'
// also matches U+017F LATIN SMALL LETTER LONG S.
func contraction(s string, i int) int {
	if i >= len(s) || s[i] != '\'' {
		return 0
	}
	low := func(j int) byte {
		if j >= len(s) {
			return 0
		}
		b := s[j]
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		return b
	}
	switch low(i + 1) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if low(i+2) == 'e' {
			return 3
		}
	case 'l':
		if low(i+2) == 'l' {
			return 3
		}
	case 0xC5: // U+017F is C5 BF
		if i+2 < len(s) && s[i+2] == 0xBF {
			return 3
		}
	}
	return 0
}

// whitespace matches `\s*[\r\n]+|\s+(?!\S)|\s+` at i (s[i] is whitespace).
func whitespace(s string, i int) int {
	e, lastNL, lastStart := i, -1, i
	for e < len(s) {
		r, c, w := at(s, e)
		if c&cWS == 0 {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = e + w
		}
		lastStart = e
		e += w
	}
	if e == i {
		return -1
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ backtracks to just after the last line break
		return lastNL
	case e == len(s): // \s+(?!\S) at the end of the piece
		return e
	case lastStart > i: // \s+(?!\S) leaves the last space for the next word
		return lastStart
	}
	return e // \s+
}

// matchCL100K is the pattern of Llama 3 (digits 3) and Qwen2/2.5/3 (digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchCL100K(digits int) matcher {
	return func(s string, i int) int {
		if n := contraction(s, i); n > 0 {
			return i + n
		}
		r, c, w := at(s, i)
		if c&cL != 0 {
			return runOf(s, i+w, cL)
		}
		if r != '\r' && r != '\n' && c&(cL|cN) == 0 {
			if _, c2, w2 := at(s, i+w); c2&cL != 0 {
				return runOf(s, i+w+w2, cL)
			}
		}
		if c&cN != 0 {
			return numbers(s, i, digits)
		}
		if e := punct(s, i, r, c, w, cWS|cL|cN, false); e > 0 {
			return e
		}
		return whitespace(s, i)
	}
}

// punct matches ` ?[^\s\p{L}\p{N}]+[\r\n]*` (slash adds '/' to the trailing set, as in
// o200k); exclude is the class set the bracket negates.
func punct(s string, i int, r rune, c uint16, w int, exclude uint16, slash bool) int {
	j := i
	if r == ' ' {
		if _, c2, w2 := at(s, i+w); w2 > 0 && c2&exclude == 0 {
			j = i + w
		} else {
			return -1
		}
	} else if c&exclude != 0 {
		return -1
	}
	for j < len(s) {
		_, c2, w2 := at(s, j)
		if c2&exclude != 0 {
			break
		}
		j += w2
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')) {
		j++
	}
	return j
}

const (
	o200Upper = cLu | cLt | cLm | cLo | cM // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	o200Lower = cLl | cLm | cLo | cM       // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

// matchO200K is gpt-oss' (o200k_harmony) pattern:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchO200K(s string, i int) int {
	r, c, w := at(s, i)
	starts := [2]int{i + w, i} // the optional prefix is greedy: try with it first
	first := 1
	if r != '\r' && r != '\n' && c&(cL|cN) == 0 {
		first = 0
	}
	// Alternative 1: Upper* then Lower+, backtracking Upper* one rune at a time.
	for _, s0 := range starts[first:] {
		var bounds [64]int
		b := bounds[:0]
		e := s0
		for e < len(s) {
			_, c2, w2 := at(s, e)
			if c2&o200Upper == 0 {
				break
			}
			b = append(b, e)
			e += w2
		}
		k := e
		for {
			if _, c2, _ := at(s, k); c2&o200Lower != 0 {
				f := runOf(s, k, o200Lower)
				return f + contraction(s, f)
			}
			if len(b) == 0 {
				break
			}
			k, b = b[len(b)-1], b[:len(b)-1]
		}
	}
	// Alternative 2: Upper+ then Lower*.
	for _, s0 := range starts[first:] {
		if e := runOf(s, s0, o200Upper); e > s0 {
			f := runOf(s, e, o200Lower)
			return f + contraction(s, f)
		}
	}
	if c&cN != 0 {
		return numbers(s, i, 3)
	}
	if e := punct(s, i, r, c, w, cWS|cL|cN, true); e > 0 {
		return e
	}
	return whitespace(s, i)
}

// numbers matches \p{N}{1,max} at i: the end after at most max number runes, or i
// when s[i] is not a number.
func numbers(s string, i, max int) int {
	j := i
	for k := 0; k < max; k++ {
		_, c, w := at(s, j)
		if c&cN == 0 {
			break
		}
		j += w
	}
	return j
}

// matchDigits3 is `\p{N}{1,3}` (DeepSeek V3's first split).
func matchDigits3(s string, i int) int {
	if j := numbers(s, i, 3); j > i {
		return j
	}
	return -1
}

func isDSCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

// matchDSCJK is `[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+` (DeepSeek V3's second split).
func matchDSCJK(s string, i int) int {
	j := i
	for j < len(s) {
		r, w := utf8.DecodeRuneInString(s[j:])
		if !isDSCJK(r) {
			break
		}
		j += w
	}
	if j == i {
		return -1
	}
	return j
}

// matchDSMain is DeepSeek V3's third split:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchDSMain(s string, i int) int {
	r, c, w := at(s, i)
	isASCIILetter := func(j int) bool {
		return j < len(s) && (('a' <= s[j] && s[j] <= 'z') || ('A' <= s[j] && s[j] <= 'Z'))
	}
	if r < 128 && r > ' ' && r != 0x7f && !isASCIILetter(i) && !('0' <= r && r <= '9') && isASCIILetter(i+1) {
		j := i + 1
		for isASCIILetter(j) {
			j++
		}
		return j
	}
	if r != '\r' && r != '\n' && c&(cL|cP|cS) == 0 {
		if _, c2, w2 := at(s, i+w); c2&(cL|cM) != 0 {
			return runOf(s, i+w+w2, cL|cM)
		}
	}
	if c&(cL|cM) != 0 {
		return runOf(s, i+w, cL|cM)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j := i
	if r == ' ' {
		if _, c2, _ := at(s, i+1); c2&(cP|cS) != 0 {
			j = i + 1
		}
	}
	if e := runOf(s, j, cP|cS); e > j {
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	if c&cWS != 0 {
		return whitespace(s, i)
	}
	return -1
}

// knownSplits maps a Split pre-tokenizer's regex, as written in tokenizer.json, to its
// hand-written matcher.
var knownSplits = map[string]matcher{}

func init() {
	// Llama 3 (digits in threes) and Qwen2/2.5/3 (single digits).
	knownSplits[`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`] = matchCL100K(3)
	knownSplits[`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`] = matchCL100K(1)
	// gpt-oss (o200k).
	knownSplits[`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`] = matchO200K
	// DeepSeek V3's three splits; its tokenizer.json writes CR and LF as raw characters
	// in the third pattern.
	knownSplits[`\p{N}{1,3}`] = matchDigits3
	knownSplits["[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"] = matchDSCJK
	knownSplits[`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`+"`{|}~][A-Za-z]+|[^\r\n"+`\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+`+"[\r\n]*"+`|\s*`+"[\r\n]+"+`|\s+(?!\S)|\s+`] = matchDSMain
}

// preTokenizer is a sequence of Isolated splits; each stage splits every piece of the
// previous stage.
type preTokenizer struct {
	stages []matcher
}

// split calls emit with each pre-token of s, in order.
func (p *preTokenizer) split(s string, emit func(string)) {
	p.splitFrom(0, s, emit)
}

func (p *preTokenizer) splitFrom(stage int, s string, emit func(string)) {
	if stage == len(p.stages) {
		emit(s)
		return
	}
	m := p.stages[stage]
	i := 0
	for i < len(s) {
		if e := m(s, i); e > i {
			p.splitFrom(stage+1, s[i:e], emit)
			i = e
			continue
		}
		// No match at i: the unmatched gap up to the next match is a piece of its own.
		j := i
		for {
			_, w := utf8.DecodeRuneInString(s[j:])
			j += w
			if j >= len(s) || m(s, j) > j {
				break
			}
		}
		p.splitFrom(stage+1, s[i:j], emit)
		i = j
	}
}

func unsupportedPattern(p string) error {
	return fmt.Errorf("%w: Split pre-tokenizer pattern %q has no hand-written matcher", ErrUnsupported, p)
}
