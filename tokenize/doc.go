// Package tokenize turns a parsed request into the token ids the engine (vLLM) will
// compute: chat template rendering, tokenizer.json byte-level BPE, and the fallback
// chain local → the worker's POST /tokenize → none. The prefix index only helps when
// these ids equal the engine's, so exactness is tested id for id against Hugging Face's
// own tokenizers and jinja2 (testdata/gen, make tokenizer-goldens).
//
// # Public API
//
// Loading and encoding (the simulator's /tokenize uses these directly):
//
//	m, err := tokenize.LoadModel(".cache/tokenizers/qwen3", tokenize.Options{})
//	ids := m.EncodeText("Hello", true)  // tokenizer.encode(text, add_special_tokens=True)
//	text, err := m.RenderChat(req)       // the chat template, as vLLM renders it
//	ids = m.EncodeText(text, false)      // chat prompts: add_special_tokens=False
//	idss, err := tokenize.LocalTokens(m, req) // both steps, per API, with vLLM's defaults
//
// LoadModel accepts a Hugging Face layout directory (tokenizer.json,
// tokenizer_config.json, optional chat_template.jinja / chat_template.json) or a hub
// cache entry (models--org--name; the refs/main snapshot). It fails with ErrUnsupported
// for anything it cannot compute exactly (a Unigram or WordPiece model, an unknown
// pre-tokenizer pattern or normalizer, …) and ErrNoTokenizer when the files are absent. A
// chat template the engine cannot compile or render is reported by ChatError at load
// time; EncodeText still works.
//
// Routing: Service implements Tokenizer over per-model path chains (ModelConfig.Paths,
// PathLocal and PathRemote in any order), records which path served each request in
// Result.Path, returns PathNone with a Degraded reason when every path failed, counts
// paths, failures and degraded requests in metrics.Tokenize, and reports per-model path
// health (Health, served at GET /debug/tokenize).
//
// The remote path asks the model's workers (ServiceOptions.Addresses) in turn, up to
// three, within ModelConfig.RemoteBudget; a worker failing three times in a row is
// skipped for RemoteBackoff on its own. A 4xx (404/405/408/429 aside) is the request's
// fault (ReasonClient): no backoff, no second worker, the request goes on degraded and
// the worker answers the client itself.
//
// Shadow check (shadow.go): Service implements Shadower; the router hands it each
// local-path result with the picked worker's address, and a sampled, rate-capped share
// is compared off the request path with that worker's /tokenize. Past a mismatch rate
// the model's local path is switched off (ReasonShadow) until ResetShadow.
//
// # Supported tokenizers
//
// Byte-level BPE with the pre-tokenizer patterns of Qwen2/2.5/3, Llama 3.x, DeepSeek V3
// and gpt-oss (o200k); normalizers none and NFC; post-processors ByteLevel and
// TemplateProcessing, plus transformers' rebuild of the post-processor for
// LlamaTokenizerFast/GemmaTokenizerFast from add_bos_token/add_eos_token. Merge
// priority is the merges list order (no assumption that ranks equal ids).
//
// SentencePiece-style BPE (Gemma 2/3, Llama 2, Mistral; sentencepiece.go): a
// tokenizer.json without a ByteLevel pre-tokenizer. Normalizers Replace (String
// pattern), Prepend, NFC and Sequences of them; pre-tokenizers none, Metaspace
// (prepend_scheme always/first/never, split on or off) and Gemma's Split on " " after
// a normalizer that left no space; byte_fallback to <0xNN> tokens, else the unknown
// token (fused with fuse_unk). Checked against the goldens of gemma3 and llama2 and
// three Metaspace variants of Llama 2's file (TestMetaspaceExact).
//
// gpt-oss chat (harmony.go): vLLM renders it with openai_harmony, not Jinja, and so
// does this package for a tokenizer with harmony's formatting tokens (RenderHarmony):
// system message with the engine host's date (HarmonyOptions: time zone, default UTC,
// or a pinned date), tools as a TypeScript-like "functions" namespace in a developer
// message, reasoning → analysis, content → final, tool calls → commentary
// to=functions.NAME, tool results → functions.NAME to=assistant, analysis dropped as
// vLLM and harmony drop it. Checked against harmony's own expected renderings
// (testdata/harmony, TestHarmonyGoldens). What the references disagree on or what
// was not checked (system/developer role messages, oneOf schemas, …) is refused with
// ErrContent, so those requests take the remote path. The shadow check skips harmony
// chat: vLLM's /tokenize renders messages with the HF template, not harmony.
//
// # How it is fast
//
//   - Added tokens (<|im_start|>, …) are split out first, with one IndexByte scan, so
//     BPE never sees them; user text containing them is matched as vLLM does.
//   - Pre-tokenizers are hand-written matchers of the regular expressions (Go's regexp
//     lacks lookahead and Oniguruma's leftmost-first alternation); see pretok.go.
//   - BPE uses an open-addressing pair table and a quadratic merge loop for short words,
//     a heap for long ones (bpe.go).
//   - A byte-bounded segment cache holds the ids of long text runs between added
//     tokens. BPE cannot merge across an added token, so a run's ids do not depend on
//     what surrounds it: the next turn of a conversation reuses every earlier message's
//     ids and only encodes the new one (cache.go).
//   - A byte-bounded render cache holds conversation prefixes rendered and tokenized:
//     the next turn renders only a window of a few messages through the template and
//     encodes only the text after the cached cut, where probe conversations proved the
//     template renders that cut exactly (incremental.go, window.go, proof.go).
//
// # Files
//
//	doc.go, tokenize.go     Tokenizer interface, Path, Result, GivenOnly
//	load.go, jsonscan.go    tokenizer.json / tokenizer_config.json, hub cache layout
//	model.go                Model, LoadModel, EncodeText, post-processor rules
//	harmony.go              gpt-oss chat rendered as openai_harmony does
//	bytelevel.go, bpe.go    byte-level alphabet, merges by rank
//	sentencepiece.go        SentencePiece-style BPE: normalizers, Metaspace, byte fallback
//	pretok.go               hand-written Split pre-tokenizers
//	added.go                added/special token splitting
//	cache.go                byte-bounded segment cache
//	render_cache.go         byte-bounded render cache, prefix hashes
//	incremental.go          chat ids from a cached prefix; the sampled self-check
//	window.go, proof.go     the window a cut renders; which cuts are proven exact
//	chat.go, jsonvalue.go   chat templates, vLLM message/tool normalization, Anthropic
//	tojson.go               jsonvalue.Values → template values; Python json.dumps tojson
//	service.go, remote.go   per-model path chains, worker /tokenize, health, metrics
//	shadow.go               sampled shadow check of local ids against the picked worker
//	testdata/gen            reference generator (make tokenizer-goldens)
//
// # Chat rendering
//
// Templates run on github.com/ardanlabs/jinja, a Jinja engine written for chat
// templates whose defaults are transformers' environment (trim_blocks, lstrip_blocks,
// loopcontrols, tojson with ensure_ascii=False and Python separators, raise_exception,
// strftime_now) and whose dicts keep insertion order. Messages, tools and kwargs come
// from the request's one parse (jsonvalue.Value: key order as sent, a repeated key
// last-wins, number literals kept) and are converted straight to template values.
// `|tojson` is routed to pyToJSON (tojson.go), which prints what json.dumps prints
// after json.loads: floats in Python repr form (1.0, 1000.0 from 1E3, 1e-07, 1e+16),
// integers of any size exactly, Python's string escapes, indent/sort_keys/separators/
// ensure_ascii. Known gap: a float printed directly ({{ x }}, not through tojson)
// still uses the engine's %g form.
// github.com/nikolalohinski/gonja/v2 (v2.9.1) was evaluated: with TrimBlocks and
// LeftStripBlocks set it renders plain Qwen3, Llama 3.1 and DeepSeek V3 conversations
// correctly, but its tojson writes `[{"a":1,"name":"z<"}]` where Python writes
// `[{"a": 1.0, "name": "z<"}]` (no spaces after separators, HTML escaping, keys
// sorted), which breaks every template that renders tools, so it was not used.
package tokenize
