package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func startWorker(t *testing.T, details bool, onBatch func(Batch)) (*Worker, string) {
	t.Helper()
	p := testProfile()
	p.StepOverhead, p.PrefillPerToken, p.DecodePerSeq = 1000000, 1000, 1000 // 1 ms steps
	return startWorkerWith(t, WorkerOptions{Profile: p, Model: "m", Seed: 7, PromptTokensDetails: details, OnBatch: onBatch})
}

// startWorkerWith runs a worker built from opt behind an HTTP test server.
func startWorkerWith(t *testing.T, opt WorkerOptions) (*Worker, string) {
	t.Helper()
	w, err := NewWorker(opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Runner.Run(ctx); close(done) }()
	srv := httptest.NewServer(w)
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return w, srv.URL
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseEvents returns the data payloads of an SSE body.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

func TestChatStreamShape(t *testing.T) {
	_, url := startWorker(t, true, nil)
	body := `{"model":"m","messages":[{"role":"system","content":"t5 t6 t7"},{"role":"user","content":[{"type":"text","text":"hello"}]}],
		"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
	resp := post(t, url+"/v1/chat/completions", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := sseEvents(t, resp.Body)
	// role chunk, 3 content chunks, usage chunk, [DONE]
	if len(evs) != 6 || evs[5] != "[DONE]" {
		t.Fatalf("%d events: %q", len(evs), evs)
	}
	type chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta        map[string]string `json:"delta"`
			FinishReason *string           `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int            `json:"prompt_tokens"`
			CompletionTokens int            `json:"completion_tokens"`
			Details          map[string]int `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	var cs []chunk
	for _, e := range evs[:5] {
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion.chunk" {
			t.Errorf("object %q", c.Object)
		}
		cs = append(cs, c)
	}
	if cs[0].Choices[0].Delta["role"] != "assistant" || cs[0].Choices[0].Delta["content"] != "" {
		t.Errorf("first chunk %+v", cs[0])
	}
	for i := 1; i <= 3; i++ {
		if cs[i].Choices[0].Delta["content"] == "" {
			t.Errorf("chunk %d has no content", i)
		}
		if fin := cs[i].Choices[0].FinishReason; (fin != nil) != (i == 3) || (fin != nil && *fin != "length") {
			t.Errorf("chunk %d finish_reason %v", i, fin)
		}
	}
	u := cs[4]
	// ChatML: <|im_start|> role \n content <|im_end|> \n per message, then
	// <|im_start|> assistant \n.
	wantPrompt := (5 + 3) + (5 + 1) + 3
	if len(u.Choices) != 0 || u.Usage == nil || u.Usage.PromptTokens != wantPrompt || u.Usage.CompletionTokens != 3 {
		t.Fatalf("usage chunk %+v (want %d prompt tokens)", u, wantPrompt)
	}
	if u.Usage.Details != nil {
		t.Errorf("cached_tokens present although zero: %v", u.Usage.Details)
	}
}

func TestCompletionsTokenIDsUsageAndCachedTokens(t *testing.T) {
	_, url := startWorker(t, true, nil)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = "1" + strings.Repeat("0", 1) + string(rune('0'+i%10))
	}
	body := `{"model":"m","prompt":[[` + strings.Join(ids, ",") + `]],"max_tokens":2}`
	var last map[string]any
	for i := 0; i < 2; i++ {
		resp := post(t, url+"/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		last = nil
		_ = json.NewDecoder(resp.Body).Decode(&last)
		resp.Body.Close()
	}
	if last["object"] != "text_completion" {
		t.Fatalf("%v", last)
	}
	u := last["usage"].(map[string]any)
	if u["prompt_tokens"].(float64) != 40 || u["completion_tokens"].(float64) != 2 {
		t.Errorf("usage %v", u)
	}
	d, ok := u["prompt_tokens_details"].(map[string]any)
	if !ok || d["cached_tokens"].(float64) != 32 {
		t.Errorf("second identical prompt: details %v, want cached_tokens 32", u["prompt_tokens_details"])
	}
}

func TestCachedTokensOmittedWithoutPromptTokensDetails(t *testing.T) {
	_, url := startWorker(t, false, nil)
	for i := 0; i < 2; i++ {
		resp := post(t, url+"/v1/completions", `{"prompt":"t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15 t16 t17 t18","max_tokens":1}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "prompt_tokens_details") {
			t.Fatalf("details without the flag: %s", b)
		}
	}
}

func TestErrorsAreClientErrors(t *testing.T) {
	_, url := startWorker(t, false, nil)
	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/v1/completions", `{"model":"other","prompt":"a"}`, 404},
		{"/v1/completions", `{"prompt":{"x":1}}`, 400},
		{"/v1/completions", `not json`, 400},
		{"/v1/chat/completions", `{"messages":[]}`, 400},
		{"/v1/completions", `{"prompt":"a","max_tokens":0}`, 400},
		{"/v1/completions", `{"prompt":"a","max_tokens":100000}`, 400},
		{"/tokenize", `{}`, 400},
	} {
		resp := post(t, url+c.path, c.body)
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || e.Error.Message == "" {
			t.Errorf("%s %s: status %d message %q, want %d", c.path, c.body, resp.StatusCode, e.Error.Message, c.status)
		}
	}
}

func TestTokenizeMetricsHealthReset(t *testing.T) {
	var mu sync.Mutex
	var batches []Batch
	w, url := startWorker(t, false, func(b Batch) { mu.Lock(); batches = append(batches, b); mu.Unlock() })
	resp := post(t, url+"/tokenize", `{"prompt":"t11 t12 hello"}`)
	var tk struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
		Max    int      `json:"max_model_len"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&tk)
	resp.Body.Close()
	if tk.Count != 3 || tk.Tokens[0] != 11 || tk.Tokens[1] != 12 || tk.Max != 64*16 {
		t.Errorf("tokenize %+v", tk)
	}
	resp = post(t, url+"/tokenize", `{"messages":[{"role":"user","content":"t11"}]}`)
	_ = json.NewDecoder(resp.Body).Decode(&tk)
	resp.Body.Close()
	if tk.Count != 9 || tk.Tokens[0] != TokImStart || tk.Tokens[3] != 11 {
		t.Errorf("chat tokenize %+v", tk)
	}
	resp = post(t, url+"/v1/completions", `{"prompt":"`+strings.Repeat("t9 ", 40)+`","max_tokens":2}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	r, _ := http.Get(url + "/metrics")
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, name := range []string{"vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
		"vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{", "vllm:time_to_first_token_seconds_bucket{",
		"vllm:inter_token_latency_seconds_bucket{", "vllm:e2e_request_latency_seconds_count{", "vllm:cache_config_info{",
		`model_name="m"`, `engine="0"`, `num_gpu_blocks="64"`, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 40"} {
		if !strings.Contains(string(b), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if r, _ := http.Get(url + "/health"); r.StatusCode != 200 {
		t.Errorf("/health %d", r.StatusCode)
	}
	resp = post(t, url+"/reset_prefix_cache", "")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("reset %d", resp.StatusCode)
	}
	mu.Lock()
	last := batches[len(batches)-1]
	mu.Unlock()
	if len(last.Events) != 1 || last.Events[0].Kind != AllBlocksCleared {
		t.Errorf("last batch %+v, want AllBlocksCleared", last)
	}
	if w.Runner.Stats().Running != 0 {
		t.Error("running after completion")
	}
}

func TestClientDisconnectAbortsTheRequest(t *testing.T) {
	w, url := startWorker(t, false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"prompt":"t1 t2 t3","max_tokens":500,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // first content chunk arrived
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	// The handler sees the cancelled request context and aborts the engine request,
	// freeing its blocks long before its 500 tokens (≥ 0.5 s of 1 ms steps) are done.
	deadline := time.Now().Add(2 * time.Second)
	for w.Runner.Stats().Running+w.Runner.Stats().Waiting > 0 {
		if time.Now().After(deadline) {
			t.Fatal("request still in the engine after the client went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := w.Runner.Stats(); s.FreeBlocks != 64 {
		t.Errorf("free blocks %d after abort, want 64", s.FreeBlocks)
	}
}

func TestTextTokensHook(t *testing.T) {
	p := testProfile()
	p.StepOverhead, p.PrefillPerToken, p.DecodePerSeq = 1000000, 1000, 1000
	var calls []bool
	var mu sync.Mutex
	w, err := NewWorker(WorkerOptions{Profile: p, Model: "m", TextTokens: func(chat bool, body []byte) ([]uint32, error) {
		mu.Lock()
		calls = append(calls, chat)
		mu.Unlock()
		if strings.Contains(string(body), "fail") {
			return nil, errBadPrompt
		}
		return []uint32{7, 8, 9, 10}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Runner.Run(ctx)
	srv := httptest.NewServer(w)
	defer srv.Close()
	for _, c := range []struct {
		path, body string
		status     int
		prompt     float64
	}{
		{"/v1/completions", `{"prompt":"any text","max_tokens":1}`, 200, 4},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`, 200, 4},
		{"/v1/completions", `{"prompt":[1,2],"max_tokens":1}`, 200, 2}, // token ids bypass the hook
		{"/v1/completions", `{"prompt":"fail","max_tokens":1}`, 400, 0},
	} {
		resp := post(t, srv.URL+c.path, c.body)
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: status %d", c.path, c.body, resp.StatusCode)
		}
		if c.status == 200 && out["usage"].(map[string]any)["prompt_tokens"].(float64) != c.prompt {
			t.Errorf("%s: usage %v", c.body, out["usage"])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 || calls[0] || !calls[1] {
		t.Errorf("hook calls %v, want [false true false]", calls)
	}
}

// TestTokenizeDisagree: with TokenizeDisagree, /tokenize answers the right count but a
// changed last id (for testing a router's shadow check), and an empty prompt one id.
func TestTokenizeDisagree(t *testing.T) {
	w, err := NewWorker(WorkerOptions{Profile: testProfile(), Model: "m", TokenizeDisagree: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w)
	defer srv.Close()
	for _, c := range []struct {
		body string
		want []uint32
	}{
		{`{"prompt":"t11 t12 t13"}`, []uint32{11, 12, 12}},
		{`{"prompt":""}`, []uint32{1}},
	} {
		resp := post(t, srv.URL+"/tokenize", c.body)
		var tk struct {
			Count  int      `json:"count"`
			Tokens []uint32 `json:"tokens"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&tk)
		resp.Body.Close()
		if tk.Count != len(c.want) || len(tk.Tokens) != len(c.want) {
			t.Fatalf("%s: %+v, want %v", c.body, tk, c.want)
		}
		for i := range c.want {
			if tk.Tokens[i] != c.want[i] {
				t.Errorf("%s: %v, want %v", c.body, tk.Tokens, c.want)
			}
		}
	}
}
