package sim

import (
	"strconv"
	"strings"
)

// Tokenizer is what the simulator needs to turn text into token ids and back. The
// StandIn implementation is used until a real tokenizer (package tokenize) is wired in.
type Tokenizer interface {
	// Encode returns the token ids of text (no special tokens added).
	Encode(text string) []uint32
	// Decode returns the text of one generated token id.
	Decode(id uint32) string
	// Chat renders messages with the model's chat template and tokenizes them.
	Chat(msgs []ChatMessage, addGenerationPrompt bool) []uint32
}

// ChatMessage is one chat message with its text content.
type ChatMessage struct {
	Role    string
	Content string
}

// Special token ids of the stand-in ChatML template (Qwen's ids).
const (
	TokImStart uint32 = 151644
	TokImEnd   uint32 = 151645
	TokNewline uint32 = 198
)

// StandIn is a deterministic STAND-IN tokenizer, not a real one: every
// whitespace-separated word is one token. A word of the form "t<N>" (N < 151643) is
// token N, so a client can send exact token ids as text; any other word is hashed
// (FNV-1a) into 100..150099. Decode(id) returns "t<id> ", which encodes back to id.
// The chat template is ChatML: <|im_start|>role\ncontent<|im_end|>\n per message.
type StandIn struct{}

// Encode implements Tokenizer.
func (StandIn) Encode(text string) []uint32 {
	words := strings.Fields(text)
	out := make([]uint32, 0, len(words))
	for _, w := range words {
		out = append(out, wordID(w))
	}
	return out
}

func wordID(w string) uint32 {
	if len(w) > 1 && w[0] == 't' {
		if n, err := strconv.ParseUint(w[1:], 10, 32); err == nil && n < 151643 {
			return uint32(n)
		}
	}
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h = (h ^ uint32(w[i])) * 16777619
	}
	return 100 + h%150000
}

// Decode implements Tokenizer.
func (StandIn) Decode(id uint32) string { return "t" + strconv.FormatUint(uint64(id), 10) + " " }

// Chat implements Tokenizer.
func (s StandIn) Chat(msgs []ChatMessage, addGenerationPrompt bool) []uint32 {
	var out []uint32
	for _, m := range msgs {
		out = append(out, TokImStart)
		out = append(out, s.Encode(m.Role)...)
		out = append(out, TokNewline)
		out = append(out, s.Encode(m.Content)...)
		out = append(out, TokImEnd, TokNewline)
	}
	if addGenerationPrompt {
		out = append(out, TokImStart)
		out = append(out, s.Encode("assistant")...)
		out = append(out, TokNewline)
	}
	return out
}

// TokensText renders token ids as stand-in text ("t<id>" words) that StandIn encodes
// back to exactly those ids.
func TokensText(ids []uint32) string {
	var b strings.Builder
	b.Grow(len(ids) * 7)
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('t')
		b.WriteString(strconv.FormatUint(uint64(id), 10))
	}
	return b.String()
}
