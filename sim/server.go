package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// WorkerOptions configures one simulated vLLM worker.
type WorkerOptions struct {
	Profile Profile
	Model   string // served model name; "" = Profile.Model
	// LoRAModules are the adapter names served on top of Model (vLLM --lora-modules
	// name=path): a request naming one runs with that adapter, in one of
	// Profile.MaxLoRAs slots.
	LoRAModules []string
	// Seed is the engine's block-hash seed; 0 picks a random one per process, as vLLM
	// does without PYTHONHASHSEED.
	Seed      uint64
	Tokenizer Tokenizer // nil: StandIn
	// TextTokens, when set, tokenizes text prompts and chat messages instead of
	// Tokenizer (e.g. package tokenize with a real tokenizer.json and chat template):
	// chat reports /v1/chat/completions (or /tokenize with messages); body is the raw
	// request body. Token-id prompts never go through it.
	TextTokens func(chat bool, body []byte) ([]uint32, error)
	// PromptTokensDetails adds usage.prompt_tokens_details.cached_tokens (vLLM
	// --enable-prompt-tokens-details), omitted when zero.
	PromptTokensDetails bool
	DefaultMaxTokens    int         // when a request sets none; 0 means 16
	MaxModelLen         int         // 0: the KV capacity in tokens
	OnBatch             func(Batch) // KV events of each step (e.g. Publisher.Publish)
	DPRank              int         // data-parallel rank written into event batches
	Now                 func() time.Time
	// TokenizeDisagree makes POST /tokenize answer wrong ids on purpose (the last id
	// is changed; an empty answer gains one), for testing a router's check of its own
	// ids against the worker's (kvroute's shadow check). Generation is unaffected.
	TokenizeDisagree bool
	// AnthropicPing adds a ping event after content_block_start in /v1/messages streams,
	// where Anthropic's API sends one; vLLM sends none (the default).
	AnthropicPing bool
	// KVRole enables vLLM NixlConnector P/D (pd_server.go): KVRoleProducer (a prefill
	// worker: do_remote_decode), KVRoleConsumer (a decode worker: do_remote_prefill) or
	// KVRoleBoth; "" none: kv_transfer_params are ignored, as vLLM without
	// --kv-transfer-config.
	KVRole string
	// EngineID is the remote_engine_id a prefill response names (vLLM
	// kv_transfer_config engine_id); "" derives one from the seed.
	EngineID string
	// SideChannel is the host:port a prefill response names as remote_host and
	// remote_port, where the worker answers PathKVRead: its own HTTP address. ""
	// names vLLM's defaults (localhost:5600), which no decode worker can read from.
	SideChannel string
	// KVHoldTimeout frees a finished prefill's blocks that no decode worker read
	// (vLLM VLLM_NIXL_ABORT_REQUEST_TIMEOUT); 0 means DefaultKVHoldTimeout.
	KVHoldTimeout time.Duration
	// HTTPClient reads remote KV (PathKVRead); nil: a client with a 10 s timeout.
	HTTPClient *http.Client
}

// Worker is one simulated vLLM server: an engine in real time behind the OpenAI HTTP API.
type Worker struct {
	opt    WorkerOptions
	Runner *Runner
	m      *workerMetrics
	mux    *http.ServeMux
	ids    atomic.Uint64
	pd     *pdState
	// Registry is the worker's private Prometheus registry (GET /metrics).
	Registry *prometheus.Registry
}

// NewWorker builds a worker; call Run to start its engine.
func NewWorker(opt WorkerOptions) (*Worker, error) {
	if opt.Model == "" {
		opt.Model = opt.Profile.Model
	}
	if opt.Tokenizer == nil {
		opt.Tokenizer = StandIn{}
	}
	if opt.DefaultMaxTokens <= 0 {
		opt.DefaultMaxTokens = 16
	}
	if opt.MaxModelLen <= 0 {
		opt.MaxModelLen = opt.Profile.NumBlocks * opt.Profile.BlockSize
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	seed := opt.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	eng, err := NewEngine(opt.Profile, seed)
	if err != nil {
		return nil, err
	}
	w := &Worker{opt: opt, Registry: prometheus.NewRegistry(), mux: http.NewServeMux()}
	w.Runner = NewRunner(eng, RunnerOptions{OnBatch: opt.OnBatch, DPRank: opt.DPRank, Now: opt.Now})
	w.m = newWorkerMetrics(w.Registry, opt.Model, opt.Profile, w.Runner.Stats)
	if len(opt.LoRAModules) > 0 {
		if opt.Profile.MaxLoRAs <= 0 {
			return nil, fmt.Errorf("sim: %d LoRA modules but max_loras is 0", len(opt.LoRAModules))
		}
		w.Registry.MustRegister(&loraInfo{max: opt.Profile.MaxLoRAs, stats: w.Runner.Stats, now: opt.Now})
	}
	if err := w.initPD(); err != nil {
		return nil, err
	}
	w.mux.HandleFunc("POST /v1/chat/completions", w.handleGenerate(true))
	w.mux.HandleFunc("POST /v1/completions", w.handleGenerate(false))
	w.mux.HandleFunc("POST /v1/messages", w.handleMessages)
	w.mux.HandleFunc("POST /tokenize", w.handleTokenize)
	w.mux.HandleFunc("GET /v1/models", w.handleModels)
	w.mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	w.mux.HandleFunc("POST /reset_prefix_cache", w.handleReset)
	w.mux.Handle("GET /metrics", promhttp.HandlerFor(w.Registry, promhttp.HandlerOpts{}))
	return w, nil
}

// ServeHTTP implements http.Handler.
func (w *Worker) ServeHTTP(rw http.ResponseWriter, r *http.Request) { w.mux.ServeHTTP(rw, r) }

// apiError writes an OpenAI-style error body.
func apiError(rw http.ResponseWriter, status int, typ, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": status}})
}

type genBody struct {
	Model               string          `json:"model"`
	Messages            []chatMsg       `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt           string          `json:"cache_salt"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
}

type chatMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text returns a message's content: a string, or the text parts of a content array.
func (m chatMsg) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	out := ""
	for _, p := range parts {
		if p.Type == "text" {
			out += p.Text
		}
	}
	return out
}

var errBadPrompt = errors.New(`"prompt" must be a string, a list of one string, a list of token ids, or a list of one list of token ids`)

// chatOrText tokenizes chat messages with TextTokens when set, else with Tokenizer.
func (w *Worker) chatOrText(chat bool, body []byte, msgs []chatMsg, genPrompt *bool) ([]uint32, error) {
	if w.opt.TextTokens != nil {
		return w.opt.TextTokens(chat, body)
	}
	return w.chatTokens(msgs, genPrompt), nil
}

// promptTokensRaw decodes a completions prompt: token ids as given, text through
// TextTokens when set.
func (w *Worker) promptTokensRaw(prompt json.RawMessage, body []byte) ([]uint32, error) {
	if w.opt.TextTokens != nil {
		var ids []uint32
		var idss [][]uint32
		if json.Unmarshal(prompt, &ids) != nil && json.Unmarshal(prompt, &idss) != nil {
			return w.opt.TextTokens(false, body)
		}
	}
	return w.promptTokens(prompt)
}

// promptTokens decodes a completions prompt.
func (w *Worker) promptTokens(raw json.RawMessage) ([]uint32, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return w.opt.Tokenizer.Encode(s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) == 1 {
		return w.opt.Tokenizer.Encode(ss[0]), nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return ids, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil && len(idss) == 1 {
		return idss[0], nil
	}
	return nil, errBadPrompt
}

func (w *Worker) chatTokens(msgs []chatMsg, genPrompt *bool) []uint32 {
	cm := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		cm[i] = ChatMessage{Role: m.Role, Content: m.text()}
	}
	return w.opt.Tokenizer.Chat(cm, genPrompt == nil || *genPrompt)
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (w *Worker) usage(prompt, completion, cached int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if w.opt.PromptTokensDetails && cached > 0 {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

// failFunc writes an error body in the shape of the API a request came on.
type failFunc func(rw http.ResponseWriter, status int, typ, msg string)

// job is one generation request, decoded from any of the APIs the worker serves.
type job struct {
	api          string // "chat", "completions" or "messages"
	prompt       []uint32
	maxTokens    int
	cacheSalt    string
	adapter      string // the LoRA adapter named as model, or ""
	stream       bool
	includeUsage bool            // OpenAI streams: stream_options.include_usage
	kvParams     json.RawMessage // kv_transfer_params (P/D, pd_server.go); nil on /v1/messages
}

// modelFor resolves a request's "model": the served model ("" is accepted), or one of
// its LoRA adapters (returned as adapter); any other name is vLLM's 404.
func (w *Worker) modelFor(rw http.ResponseWriter, model string, fail failFunc) (adapter string, ok bool) {
	if slices.Contains(w.opt.LoRAModules, model) {
		return model, true
	}
	if model != "" && model != w.opt.Model {
		fail(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model))
		return "", false
	}
	return "", true
}

func (w *Worker) handleGenerate(chat bool) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		arrival := w.opt.Now()
		raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			apiError(rw, http.StatusBadRequest, "BadRequestError", "reading body: "+err.Error())
			return
		}
		var body genBody
		if err := json.Unmarshal(raw, &body); err != nil {
			apiError(rw, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
			return
		}
		adapter, ok := w.modelFor(rw, body.Model, apiError)
		if !ok {
			return
		}
		var prompt []uint32
		if chat {
			if len(body.Messages) == 0 {
				apiError(rw, http.StatusBadRequest, "BadRequestError", `"messages" is required`)
				return
			}
			if prompt, err = w.chatOrText(true, raw, body.Messages, body.AddGenerationPrompt); err != nil {
				apiError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
				return
			}
		} else {
			if prompt, err = w.promptTokensRaw(body.Prompt, raw); err != nil {
				apiError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
				return
			}
		}
		maxTok := w.opt.DefaultMaxTokens
		if body.MaxCompletionTokens != nil {
			maxTok = *body.MaxCompletionTokens
		} else if body.MaxTokens != nil {
			maxTok = *body.MaxTokens
		}
		j := job{api: "completions", prompt: prompt, maxTokens: maxTok, cacheSalt: body.CacheSalt, adapter: adapter, stream: body.Stream,
			includeUsage: body.StreamOptions != nil && body.StreamOptions.IncludeUsage, kvParams: body.KVTransferParams}
		if chat {
			j.api = "chat"
		}
		w.generate(rw, r, arrival, j, apiError)
	}
}

// generate checks a decoded request against the engine's limits, submits it and writes
// its answer (streamed or whole) in the shape of its API.
func (w *Worker) generate(rw http.ResponseWriter, r *http.Request, arrival time.Time, j job, fail failFunc) {
	if j.maxTokens < 1 {
		fail(rw, http.StatusBadRequest, "BadRequestError", "max_tokens must be at least 1")
		return
	}
	if len(j.prompt)+j.maxTokens > w.opt.MaxModelLen {
		fail(rw, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			w.opt.MaxModelLen, len(j.prompt)+j.maxTokens, len(j.prompt), j.maxTokens))
		return
	}
	id := w.ids.Add(1)
	prefix := "chatcmpl-" // vLLM's Anthropic endpoint answers with its chat completion's id
	if j.api == "completions" {
		prefix = "cmpl-"
	}
	rid := prefix + strconv.FormatUint(id, 10) + "-" + strconv.FormatUint(rand.Uint64()>>32, 16)
	req := &Request{ID: rid, Prompt: j.prompt, MaxTokens: j.maxTokens, CacheSalt: j.cacheSalt, LoRA: j.adapter}
	if err := w.applyKVParams(r.Context(), j.kvParams, req); err != nil {
		fail(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	ch, err := w.Runner.Submit(req)
	if err != nil {
		fail(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	w.m.promptTokens.Add(float64(len(j.prompt)))
	model := w.opt.Model
	if j.adapter != "" {
		model = j.adapter
	}
	s := &stream{w: w, rw: rw, chat: j.api != "completions", id: rid, model: model, created: arrival.Unix(), arrival: arrival,
		includeUsage: j.includeUsage, promptLen: len(j.prompt)}
	switch {
	case j.api == "messages" && j.stream:
		s.messagesSSE(r, req, ch, len(j.prompt))
	case j.api == "messages":
		s.messagesWhole(r, req, ch, len(j.prompt))
	case j.stream:
		s.sse(r, req, ch, len(j.prompt))
	default:
		s.whole(r, req, ch, len(j.prompt))
	}
}

type stream struct {
	w            *Worker
	rw           http.ResponseWriter
	chat         bool
	id, model    string
	created      int64
	arrival      time.Time
	includeUsage bool
	promptLen    int
}

func (s *stream) object() string {
	if s.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (s *stream) choice(text string, role bool, finish any) map[string]any {
	c := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
	if s.chat {
		d := map[string]any{"content": text}
		if role {
			d["role"] = "assistant"
		}
		c["delta"] = d
	} else {
		c["text"] = text
	}
	return c
}

func (s *stream) event(v any) error {
	b, _ := json.Marshal(v)
	if _, err := fmt.Fprintf(s.rw, "data: %s\n\n", b); err != nil {
		return err
	}
	if f, ok := s.rw.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// observe records the latency metrics of one output.
func (s *stream) observe(o Output, last *time.Time) {
	now := s.w.opt.Now()
	if o.First {
		s.w.m.ttft.Observe(now.Sub(s.arrival).Seconds())
		s.w.m.bySource(s.promptLen, o)
	} else {
		s.w.m.itl.Observe(now.Sub(*last).Seconds())
	}
	*last = now
	s.w.m.genTokens.Inc()
	if o.Finished {
		s.w.m.e2e.Observe(now.Sub(s.arrival).Seconds())
		s.w.m.success.Inc()
	}
}

func (s *stream) sse(r *http.Request, req *Request, ch <-chan Output, promptLen int) {
	h := s.rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	s.rw.WriteHeader(http.StatusOK)
	base := func(choices []map[string]any) map[string]any {
		return map[string]any{"id": s.id, "object": s.object(), "created": s.created, "model": s.model, "choices": choices}
	}
	if s.chat {
		if s.event(base([]map[string]any{s.choice("", true, nil)})) != nil {
			s.w.Runner.Cancel(req)
			return
		}
	}
	var last time.Time
	var fin Output
	for {
		select {
		case <-r.Context().Done():
			s.w.Runner.Cancel(req)
			return
		case o, ok := <-ch:
			if !ok {
				return
			}
			s.observe(o, &last)
			var finish any
			if o.Finished {
				finish = "length"
			}
			if s.event(base([]map[string]any{s.choice(s.w.opt.Tokenizer.Decode(o.Token), false, finish)})) != nil {
				s.w.Runner.Cancel(req)
				return
			}
			if !o.Finished {
				continue
			}
			fin = o
		}
		break
	}
	if fin.HeldBlocks != nil { // streamed: held for a decode worker, no kv_transfer_params sent
		s.w.holdKV(s.id, req, fin.HeldBlocks)
	}
	if s.includeUsage {
		m := base([]map[string]any{})
		m["usage"] = s.w.usage(promptLen, fin.Generated, fin.CachedTokens)
		_ = s.event(m)
	}
	_, _ = fmt.Fprint(s.rw, "data: [DONE]\n\n")
	if f, ok := s.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// collect reads a request's outputs to the end and returns the generated text and
// the final output; ok is false when the client went away (the request is cancelled).
func (s *stream) collect(r *http.Request, req *Request, ch <-chan Output) (text []byte, fin Output, ok bool) {
	var last time.Time
	for fin.Req == nil {
		select {
		case <-r.Context().Done():
			s.w.Runner.Cancel(req)
			return nil, fin, false
		case o, open := <-ch:
			if !open {
				return nil, fin, false
			}
			s.observe(o, &last)
			text = append(text, s.w.opt.Tokenizer.Decode(o.Token)...)
			if o.Finished {
				fin = o
			}
		}
	}
	return text, fin, true
}

func (s *stream) whole(r *http.Request, req *Request, ch <-chan Output, promptLen int) {
	text, fin, ok := s.collect(r, req, ch)
	if !ok {
		return
	}
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length"}
	obj := "text_completion"
	if s.chat {
		obj = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": string(text)}
	} else {
		choice["text"] = string(text)
	}
	resp := map[string]any{"id": s.id, "object": obj, "created": s.created, "model": s.model,
		"choices": []any{choice}, "usage": s.w.usage(promptLen, fin.Generated, fin.CachedTokens)}
	if fin.HeldBlocks != nil {
		resp["kv_transfer_params"] = s.w.holdKV(s.id, req, fin.HeldBlocks)
	}
	s.rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(s.rw).Encode(resp)
}

func (w *Worker) handleTokenize(rw http.ResponseWriter, r *http.Request) {
	var body struct {
		Prompt              json.RawMessage `json:"prompt"`
		Messages            []chatMsg       `json:"messages"`
		AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		apiError(rw, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	var toks []uint32
	switch {
	case len(body.Messages) > 0:
		if toks, err = w.chatOrText(true, raw, body.Messages, body.AddGenerationPrompt); err != nil {
			apiError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
	case len(body.Prompt) > 0:
		if toks, err = w.promptTokensRaw(body.Prompt, raw); err != nil {
			apiError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
	default:
		apiError(rw, http.StatusBadRequest, "BadRequestError", `"prompt" or "messages" is required`)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	if w.opt.TokenizeDisagree {
		toks = append([]uint32(nil), toks...)
		if len(toks) == 0 {
			toks = append(toks, 0)
		}
		toks[len(toks)-1] ^= 1
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"count": len(toks), "max_model_len": w.opt.MaxModelLen, "tokens": toks})
}

func (w *Worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	rw.Header().Set("Content-Type", "application/json")
	data := []any{map[string]any{"id": w.opt.Model, "object": "model", "owned_by": "vllm", "max_model_len": w.opt.MaxModelLen}}
	for _, a := range w.opt.LoRAModules { // vLLM lists adapters with their base as parent
		data = append(data, map[string]any{"id": a, "object": "model", "owned_by": "vllm", "parent": w.opt.Model, "max_model_len": w.opt.MaxModelLen})
	}
	_ = json.NewEncoder(rw).Encode(map[string]any{"object": "list", "data": data})
}

func (w *Worker) handleReset(rw http.ResponseWriter, _ *http.Request) {
	if !w.Runner.ResetPrefixCache() {
		apiError(rw, http.StatusConflict, "ConflictError", "prefix cache not reset: requests still hold KV blocks")
		return
	}
	rw.WriteHeader(http.StatusOK)
}
