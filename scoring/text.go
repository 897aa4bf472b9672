package scoring

import (
	"encoding/binary"
	"strings"

	"github.com/kvroute/kvroute/internal/jsonvalue"
)

// PromptText is the text the text-based baselines (GIE approximate prefix, SGLang
// cache-aware) match prefixes on, as those routers see a request: the system prompt,
// then each message as "role: content" (text parts of multi-part content joined), or the
// completions prompts; nothing is templated. With no request text (nil Request, token-id
// prompts, a simulator that only has tokens) it falls back to the prompt token ids as
// 4 little-endian bytes each, so prefix relations between requests are preserved.
func PromptText(in *Input) string {
	var b strings.Builder
	if r := in.Request; r != nil {
		if !r.System.IsNull() {
			writeContent(&b, r.System)
			b.WriteByte('\n')
		}
		for _, m := range r.Messages {
			role, _ := m.Field("role").Str()
			b.WriteString(role)
			b.WriteString(": ")
			writeContent(&b, m.Field("content"))
			b.WriteByte('\n')
		}
		for i, p := range r.Prompts {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(p)
		}
		if b.Len() == 0 && len(r.PromptTokenIDs) > 0 {
			writeTokens(&b, r.PromptTokenIDs[0])
		}
	}
	if b.Len() == 0 && len(in.Tokens) > 0 {
		writeTokens(&b, in.Tokens)
	}
	return b.String()
}

func writeTokens(b *strings.Builder, toks []uint32) {
	var buf [4]byte
	b.Grow(4 * len(toks))
	for _, t := range toks {
		binary.LittleEndian.PutUint32(buf[:], t)
		b.Write(buf[:])
	}
}

// writeContent writes a message content: a string, or the "text" of each part of a
// multi-part content (OpenAI content parts, Anthropic content blocks); other parts
// (images, tool calls) are written as their type name.
func writeContent(b *strings.Builder, c jsonvalue.Value) {
	switch c.Kind() {
	case jsonvalue.Null:
	case jsonvalue.String, jsonvalue.Number:
		b.WriteString(c.Text())
	case jsonvalue.Array:
		for i := range c.Len() {
			p := c.Index(i)
			if p.Kind() == jsonvalue.Object {
				if t, ok := p.Field("text").Str(); ok {
					b.WriteString(t)
				} else if t, ok := p.Field("type").Str(); ok {
					b.WriteString("<" + t + ">")
				}
			} else {
				writeContent(b, p)
			}
		}
	default:
		b.Write(c.AppendJSON(nil))
	}
}
