package tokenize

import "strings"

// addedTokens finds added tokens (special or not) in text before BPE, the way
// tokenizers/src/tokenizer/added_vocabulary.rs does: a leftmost-longest match over
// all tokens, so "<|im_start|>" typed by a user is the special token, not text.
// Splitting here, once, keeps long chats fast: the BPE never sees the specials.
type addedTokens struct {
	root   *trieNode
	first  [256]bool // bytes that start some token
	nfirst int       // number of distinct first bytes
	only   byte      // the first byte when nfirst == 1: scanned with IndexByte (SIMD)
	maxLen int       // the longest token's length in bytes
}

type trieNode struct {
	next map[byte]*trieNode
	id   uint32
	term bool
}

func (a *addedTokens) add(content string, id uint32) {
	if content == "" {
		return
	}
	if a.root == nil {
		a.root = &trieNode{}
	}
	n := a.root
	for i := 0; i < len(content); i++ {
		c := n.next[content[i]]
		if c == nil {
			if n.next == nil {
				n.next = map[byte]*trieNode{}
			}
			c = &trieNode{}
			n.next[content[i]] = c
		}
		n = c
	}
	n.term, n.id = true, id
	a.maxLen = max(a.maxLen, len(content))
	if !a.first[content[0]] {
		a.first[content[0]] = true
		a.nfirst++
		a.only = content[0]
	}
}

// longest returns the length and id of the longest token starting at s[i], or 0.
func (a *addedTokens) longest(s string, i int) (int, uint32) {
	n, best, id := a.root, 0, uint32(0)
	for j := i; j < len(s) && n != nil; j++ {
		n = n.next[s[j]]
		if n != nil && n.term {
			best, id = j-i+1, n.id
		}
	}
	return best, id
}

// segment is a piece of text between added tokens, or one added token (text == ""
// and special set).
type segment struct {
	text    string
	id      uint32
	special bool
	end     int // offset in the split text just after the segment
}

// split appends the segments of s to dst: text runs and added tokens, in order.
func (a *addedTokens) split(dst []segment, s string) []segment {
	if a.root == nil {
		if s != "" {
			dst = append(dst, segment{text: s, end: len(s)})
		}
		return dst
	}
	start := 0
	for i := 0; i < len(s); i++ {
		if a.nfirst == 1 {
			// Every added token of these families starts with '<': jump between them.
			j := strings.IndexByte(s[i:], a.only)
			if j < 0 {
				break
			}
			i += j
		} else if !a.first[s[i]] {
			continue
		}
		if n, id := a.longest(s, i); n > 0 {
			if i > start {
				dst = append(dst, segment{text: s[start:i], end: i})
			}
			dst = append(dst, segment{id: id, special: true, end: i + n})
			i += n - 1
			start = i + 1
		}
	}
	if start < len(s) {
		dst = append(dst, segment{text: s[start:], end: len(s)})
	}
	return dst
}
