package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/sim"
)

func echoServer(t *testing.T) *httptest.Server {
	t.Helper()
	prof, err := sim.LookupProfile("l40s-27b")
	if err != nil {
		t.Fatal(err)
	}
	w, err := sim.NewWorker(sim.WorkerOptions{Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&echoHandler{next: w, model: "m", tokens: 3})
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, body string) (int, string, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// --echo answers a streaming chat request with its chunks, usage and [DONE]; a
// non-streaming one with one JSON completion; other paths reach the simulated worker.
func TestEchoAnswers(t *testing.T) {
	srv := echoServer(t)
	big := strings.Repeat("word ", 50_000) // 250 KB
	code, ct, body := post(t, srv.URL+"/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"say \"stream\": true `+big+`"}],"stream" : true}`)
	if code != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s %.200s", code, ct, body)
	}
	if n := strings.Count(body, `"delta":{"content":"x"}`); n != 3 {
		t.Fatalf("stream: %d content chunks, want 3: %s", n, body)
	}
	if !strings.Contains(body, `"prompt_tokens":`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream: no usage or [DONE]: %s", body)
	}
	code, ct, body = post(t, srv.URL+"/v1/completions", `{"model":"m","prompt":"say \"stream\": true","stream":false}`)
	if code != 200 || ct != "application/json" || !strings.Contains(body, `"text":"xxx"`) || strings.Contains(body, "data:") {
		t.Fatalf("non-stream: %d %s %s", code, ct, body)
	}
	code, _, body = post(t, srv.URL+"/tokenize", `{"model":"m","prompt":"t1 t2 t3"}`)
	if code != 200 || !strings.Contains(body, `"count":3`) {
		t.Fatalf("/tokenize: %d %s", code, body)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "vllm:num_requests_running") {
		t.Fatalf("/metrics: %.300s", b)
	}
}

func TestStreamsScan(t *testing.T) {
	for body, want := range map[string]bool{
		`{"stream":true}`:                             true,
		`{"stream" :  true}`:                          true,
		`{"stream":false}`:                            false,
		`{"stream_options":{},"stream":true}`:         true,
		`{"content":"\"stream\":true"}`:               false,
		`{"messages":[]}`:                             false,
		`{"content":"\"stream\":true","stream":true}`: true,
	} {
		if got := streams([]byte(body)); got != want {
			t.Errorf("streams(%s) = %v, want %v", body, got, want)
		}
	}
}
