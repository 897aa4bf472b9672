package tokenize

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/kvroute/kvroute/request"
)

// Model is one loaded tokenizer: tokenizer.json's byte-level BPE with its added
// tokens, normalizer and post-processor, plus the chat template and special tokens of
// tokenizer_config.json. A Model is immutable after LoadModel except for its segment
// cache, and safe for concurrent use.
type Model struct {
	Dir   string // the resolved Hugging Face layout directory
	Class string // tokenizer_config.json tokenizer_class, e.g. "Qwen2Tokenizer"

	bpe   *bpe
	pre   *preTokenizer // byte-level models
	sp    *spText       // SentencePiece-style models (normalizer + Metaspace)
	nfc   bool
	post  postProcessor
	raw   addedTokens // added tokens matched on raw text (normalized: false)
	norm  addedTokens // added tokens matched after normalization (normalized: true)
	names map[uint32]string

	// specials are tokenizer_config's special tokens by attribute (bos_token, …),
	// passed to the chat template; additional holds additional_special_tokens.
	specials   map[string]string
	additional []string
	chat       *chatTemplate // nil: no template (chatErr says why)
	chatErr    error
	// harmony is set for gpt-oss (o200k_harmony): chat requests are rendered by
	// harmony.go, as vLLM does with openai_harmony, not by a Jinja template.
	harmony     *harmonyIDs
	harmonyOpts HarmonyOptions

	cache  *segmentCache
	render *renderCache // nil: disabled or no chat template
}

// Options tune LoadModel.
type Options struct {
	// CacheBytes bounds the segment cache (token ids of long text runs between
	// special tokens, reused by the next turn of a conversation). 0 means
	// DefaultCacheBytes; negative disables the cache.
	CacheBytes int64
	// MinCachedSegment is the shortest text run, in bytes, worth caching. 0 means
	// DefaultMinCachedSegment.
	MinCachedSegment int
	// RenderCacheBytes bounds the render cache (conversation prefixes rendered and
	// tokenized, extended by the next turn: incremental.go). 0 means
	// DefaultRenderCacheBytes; negative disables it.
	RenderCacheBytes int64
	// Harmony sets the engine-side inputs of gpt-oss chat rendering (the date in the
	// system message).
	Harmony HarmonyOptions
}

// DefaultCacheBytes is the segment cache bound when Options.CacheBytes is 0: 64 MiB,
// about 16 M cached token ids.
const DefaultCacheBytes = 64 << 20

// DefaultMinCachedSegment is the shortest cached text run when Options.MinCachedSegment
// is ≤ 0, bytes.
const DefaultMinCachedSegment = 256

// WithDefaults returns o with the value LoadModel gives each zero field (CacheBytes
// DefaultCacheBytes, MinCachedSegment DefaultMinCachedSegment, RenderCacheBytes
// DefaultRenderCacheBytes); a negative cache bound stays negative (no cache).
func (o Options) WithDefaults() Options {
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.MinCachedSegment <= 0 {
		o.MinCachedSegment = DefaultMinCachedSegment
	}
	if o.RenderCacheBytes == 0 {
		o.RenderCacheBytes = DefaultRenderCacheBytes
	}
	return o
}

// LoadModel loads the tokenizer in dir (a Hugging Face layout directory or a hub cache
// entry, see ResolveDir). Unsupported tokenizers fail with ErrUnsupported. A missing or
// unusable chat template does not fail the load: EncodeText works and RenderChat
// returns the reason (ChatError reports it up front).
func LoadModel(dir string, opts Options) (*Model, error) {
	d, err := ResolveDir(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(d, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoTokenizer, err)
	}
	var t tokenizerJSON
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("tokenize: %s/tokenizer.json: %w", d, err)
	}
	m := &Model{Dir: d, names: map[uint32]string{}, specials: map[string]string{}}
	sentencePiece := !usesByteLevel(t.PreTokenizer)
	if m.bpe, err = buildBPE(&t, sentencePiece); err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	if sentencePiece {
		if m.sp, err = buildSPText(t.Normalizer, t.PreTokenizer); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		m.nfc = m.sp.hasNFC()
	} else {
		if m.nfc, err = buildNormalizer(t.Normalizer); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		if m.pre, err = buildPreTokenizer(t.PreTokenizer); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
	}
	if err := buildPostProcessor(t.PostProcessor, &m.post); err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	for _, a := range t.AddedTokens {
		if a.LStrip || a.RStrip || a.SingleWord {
			return nil, fmt.Errorf("%s: %w: added token %q uses lstrip/rstrip/single_word", d, ErrUnsupported, a.Content)
		}
		if a.Normalized && m.sp != nil && m.sp.changesText() {
			return nil, fmt.Errorf("%s: %w: added token %q is normalized by a Replace/Prepend normalizer", d, ErrUnsupported, a.Content)
		}
		if a.Normalized && m.nfc {
			m.norm.add(norm.NFC.String(a.Content), a.ID)
		} else if a.Normalized {
			m.norm.add(a.Content, a.ID)
		} else {
			m.raw.add(a.Content, a.ID)
		}
		m.names[a.ID] = a.Content
	}
	if err := m.loadConfig(d, &t); err != nil {
		return nil, err
	}
	// vLLM renders gpt-oss chat with openai_harmony whatever chat_template.jinja says;
	// harmony's formatting tokens (<|start|>, <|channel|>, <|constrain|>, <|call|>, …)
	// are o200k_harmony's, i.e. gpt-oss.
	if m.harmony = harmonyFor(m); m.harmony != nil {
		m.harmonyOpts, m.chatErr = opts.Harmony, nil
	}
	opts = opts.WithDefaults()
	if opts.CacheBytes > 0 {
		m.cache = newSegmentCache(opts.CacheBytes, opts.MinCachedSegment)
	}
	if rb := opts.RenderCacheBytes; rb > 0 && m.chat != nil && m.harmony == nil {
		m.render = newRenderCache(rb)
		// The proof for requests without tools or kwargs is made now; others in the
		// background when first seen.
		plain := &request.Request{API: request.APIChat}
		if c, err := m.prepareChat(plain); err == nil {
			m.render.proofs[contextHash(plain)] = m.prove(c.vars)
		}
	}
	return m, nil
}

// tokenizerConfig is the part of tokenizer_config.json this package reads.
type tokenizerConfig struct {
	Class                   string          `json:"tokenizer_class"`
	AddBOS                  *bool           `json:"add_bos_token"`
	AddEOS                  *bool           `json:"add_eos_token"`
	ChatTemplate            json.RawMessage `json:"chat_template"`
	AdditionalSpecialTokens []any           `json:"additional_special_tokens"`
}

// specialKeys are transformers' SPECIAL_TOKENS_ATTRIBUTES (additional ones apart).
var specialKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

func tokenString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		s, _ := x["content"].(string)
		return s
	}
	return ""
}

func (m *Model) loadConfig(d string, t *tokenizerJSON) error {
	var cfg tokenizerConfig
	var all map[string]any
	if data, err := os.ReadFile(filepath.Join(d, "tokenizer_config.json")); err == nil {
		if err := json.Unmarshal(data, &cfg); err != nil {
			return fmt.Errorf("tokenize: %s/tokenizer_config.json: %w", d, err)
		}
		_ = json.Unmarshal(data, &all)
	}
	m.Class = cfg.Class
	for _, k := range specialKeys {
		if s := tokenString(all[k]); s != "" {
			m.specials[k] = s
		}
	}
	for _, a := range cfg.AdditionalSpecialTokens {
		if s := tokenString(a); s != "" {
			m.additional = append(m.additional, s)
		}
	}
	// transformers' LlamaTokenizerFast and GemmaTokenizerFast rebuild the
	// post-processor at load time from add_bos_token/add_eos_token
	// (update_post_processor; defaults bos true, eos false), whatever tokenizer.json
	// says. DeepSeek V3 relies on this for its BOS.
	switch strings.TrimSuffix(cfg.Class, "Fast") {
	case "LlamaTokenizer", "GemmaTokenizer", "CodeLlamaTokenizer":
		addBOS, addEOS := true, false
		if cfg.AddBOS != nil {
			addBOS = *cfg.AddBOS
		}
		if cfg.AddEOS != nil {
			addEOS = *cfg.AddEOS
		}
		m.post = postProcessor{}
		if addBOS {
			id, ok := m.SpecialID(m.specials["bos_token"])
			if !ok {
				return fmt.Errorf("tokenize: %s: %w: add_bos_token without a known bos_token", d, ErrUnsupported)
			}
			m.post.before = []uint32{id}
		}
		if addEOS {
			id, ok := m.SpecialID(m.specials["eos_token"])
			if !ok {
				return fmt.Errorf("tokenize: %s: %w: add_eos_token without a known eos_token", d, ErrUnsupported)
			}
			m.post.after = []uint32{id}
		}
	}
	src, err := chatTemplateSource(d, cfg.ChatTemplate)
	if err != nil {
		m.chatErr = err
		return nil
	}
	m.chat, m.chatErr = compileChatTemplate(src)
	return nil
}

// chatTemplateSource picks the template as transformers does: chat_template.jinja, then
// chat_template.json, then tokenizer_config.json's chat_template (a string, or a list of
// named templates of which "default" is used).
func chatTemplateSource(d string, inConfig json.RawMessage) (string, error) {
	if b, err := os.ReadFile(filepath.Join(d, "chat_template.jinja")); err == nil {
		return string(b), nil
	}
	if b, err := os.ReadFile(filepath.Join(d, "chat_template.json")); err == nil {
		var x struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if err := json.Unmarshal(b, &x); err == nil && len(x.ChatTemplate) > 0 {
			inConfig = x.ChatTemplate
		}
	}
	if len(inConfig) == 0 || string(inConfig) == "null" {
		return "", ErrNoTemplate
	}
	var s string
	if json.Unmarshal(inConfig, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(inConfig, &named) == nil {
		for _, n := range named {
			if n.Name == "default" {
				return n.Template, nil
			}
		}
	}
	return "", fmt.Errorf("%w: chat_template has no default template", ErrNoTemplate)
}

// SpecialID returns the id of an added token by its content.
func (m *Model) SpecialID(content string) (uint32, bool) {
	if content == "" {
		return 0, false
	}
	for _, a := range []*addedTokens{&m.raw, &m.norm} {
		if a.root == nil {
			continue
		}
		if n, id := a.longest(content, 0); n == len(content) {
			return id, true
		}
	}
	return 0, false
}

// ChatError reports why RenderChat cannot work for this model (nil when it can).
func (m *Model) ChatError() error { return m.chatErr }

// EncodeText tokenizes s as tokenizer.encode(s, add_special_tokens=addSpecial) does:
// added tokens in s are matched first, the text between them is normalized,
// pre-tokenized and BPE-encoded, and with addSpecial the post-processor's tokens
// (e.g. BOS) are added.
func (m *Model) EncodeText(s string, addSpecial bool) []uint32 {
	// About 4 bytes per token in English; one allocation for typical text.
	return m.AppendText(make([]uint32, 0, len(s)/4+8), s, addSpecial)
}

// AppendText is EncodeText appending to dst.
func (m *Model) AppendText(dst []uint32, s string, addSpecial bool) []uint32 {
	if addSpecial {
		dst = append(dst, m.post.before...)
	}
	dst, _, _ = m.appendBody(dst, s, true, -1)
	if addSpecial {
		dst = append(dst, m.post.after...)
	}
	return dst
}

// appendBody encodes s without the post-processor's tokens. first says whether s starts
// the text (SentencePiece prepends its space to the first run only). With limit ≥ 0 it
// also returns cut, the offset in s just after the last added token that ends at or
// before limit (0 when none), and at, len(dst) at that point: the ids of s[:cut] are
// then dst[len before:at] whatever follows s[:cut], because added tokens are split out
// before any normalization or BPE and nothing merges across them.
func (m *Model) appendBody(dst []uint32, s string, first bool, limit int) (out []uint32, cut, at int) {
	at = len(dst)
	var buf [64]segment
	for i, seg := range m.raw.split(buf[:0], s) {
		if seg.special {
			dst = append(dst, seg.id)
			if seg.end <= limit {
				cut, at = seg.end, len(dst)
			}
			continue
		}
		atStart := first && i == 0
		if m.sp != nil && m.norm.root == nil {
			dst = m.appendSegment(dst, m.sp.normalize(seg.text, atStart))
			continue
		}
		text := seg.text
		if m.nfc && !isASCII(text) {
			text = norm.NFC.String(text)
		}
		if m.norm.root == nil {
			dst = m.appendSegment(dst, text)
			continue
		}
		// SentencePiece models get here with NFC-only normalizers (see LoadModel).
		var buf2 [16]segment
		for j, s2 := range m.norm.split(buf2[:0], text) {
			switch {
			case s2.special:
				dst = append(dst, s2.id)
			case m.sp != nil:
				dst = m.appendSegment(dst, m.sp.normalize(s2.text, atStart && j == 0))
			default:
				dst = m.appendSegment(dst, s2.text)
			}
		}
	}
	return dst, cut, at
}

// appendSegment encodes one normalized text run with no added tokens in it. Runs are
// independent of each other (BPE never merges across an added token), so a long run's
// ids can be cached and reused whenever the same run comes again: that is how the next
// turn of a conversation only pays for its new text.
func (m *Model) appendSegment(dst []uint32, s string) []uint32 {
	if m.cache != nil && len(s) >= m.cache.min {
		if ids, ok := m.cache.get(s); ok {
			return append(dst, ids...)
		}
		start := len(dst)
		dst = m.encodeSegment(dst, s)
		m.cache.put(s, dst[start:])
		return dst
	}
	return m.encodeSegment(dst, s)
}

func (m *Model) encodeSegment(dst []uint32, s string) []uint32 {
	if m.sp != nil {
		m.sp.words(s, func(w string) {
			dst = m.bpe.encodeSPRun(dst, w)
		})
		return dst
	}
	m.pre.split(s, func(piece string) {
		dst = m.bpe.encode(dst, piece)
	})
	return dst
}

// isASCII reports whether s has no byte ≥ 0x80, eight bytes at a time (NFC leaves
// ASCII unchanged, so ASCII runs skip the normalizer).
func isASCII(s string) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if binary.LittleEndian.Uint64([]byte(s[i:i+8]))&0x8080808080808080 != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// TokenString returns the content of an added token id ("" for other ids).
func (m *Model) TokenString(id uint32) string { return m.names[id] }
