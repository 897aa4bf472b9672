package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// sseWorker answers every chat request with one content chunk and [DONE] after delay.
func sseWorker(t *testing.T, delay time.Duration, status int) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if status != http.StatusOK {
			http.Error(w, "refused", status)
			return
		}
		time.Sleep(delay) // a slower target, not a timing assertion: the test checks ordering only
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestChatBodySizeAndShape(t *testing.T) {
	for _, n := range []int{4 << 10, 220 << 10} {
		b := ChatBody("m", n, 3, 1)
		if len(b) < n*9/10 || len(b) > n*11/10 {
			t.Fatalf("ChatBody(%d) is %d bytes", n, len(b))
		}
		var v struct {
			Model    string `json:"model"`
			Stream   bool   `json:"stream"`
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal(b, &v); err != nil || v.Model != "m" || !v.Stream || v.Messages[len(v.Messages)-1].Role != "user" {
			t.Fatalf("ChatBody(%d): %v %+v", n, err, v.Messages[:1])
		}
		if string(ChatBody("m", n, 4, 1)[:200]) == string(b[:200]) {
			t.Fatal("variants share their first bytes: bodies must be distinct from the first message")
		}
	}
}

// A sweep measures every target at every point, reports the router's added TTFT as its
// percentile minus direct's, counts a refusing target's requests as errors, and reads
// the router's CPU from the function given.
func TestRunLoad(t *testing.T) {
	direct := sseWorker(t, 0, 200)
	slow := sseWorker(t, 20*time.Millisecond, 200)
	bad := sseWorker(t, 0, 503)
	cpu := 0.0
	o := LoadOptions{Model: "m", Direct: HTTPTarget{Name: "direct", URLs: []string{direct.URL}},
		Routers:     []HTTPTarget{{Name: "slow", URLs: []string{slow.URL}}, {Name: "bad", URLs: []string{bad.URL}}},
		Concurrency: []int{1, 4}, BodyBytes: []int{4 << 10}, Requests: 8, Distinct: 2,
		RouterCPU: []func() (float64, error){func() (float64, error) { cpu += 0.5; return cpu, nil }, nil}}
	pts := RunLoad(context.Background(), o)
	if len(pts) != 2 {
		t.Fatalf("%d points, want 2", len(pts))
	}
	for _, p := range pts {
		if p.Direct.Requests != 8 || p.Direct.Errors != 0 || p.Routers[0].Requests != 8 || p.Routers[0].Errors != 0 {
			t.Fatalf("point %+v", p)
		}
		if p.AddedP50[0] != p.Routers[0].TTFTp50-p.Direct.TTFTp50 || p.AddedP50[0] <= 0 {
			t.Fatalf("added p50 %v: slow %v direct %v", p.AddedP50[0], p.Routers[0].TTFTp50, p.Direct.TTFTp50)
		}
		if b := p.Routers[1]; b.Errors != 8 || !strings.Contains(b.FirstError, "HTTP 503") || b.CPUPerRequest != -1 {
			t.Fatalf("refusing target: %+v", b)
		}
		if c := p.Routers[0].CPUPerRequest; c != 0.5/8 {
			t.Fatalf("CPU per request %v, want 0.5 s / 8", c)
		}
	}
	if tab := FormatLoad(pts); !strings.Contains(tab, "| 4 KB | 4 | slow | 8 | 0 |") {
		t.Fatalf("table:\n%s", tab)
	}
}

func TestProcCPU(t *testing.T) {
	s, err := ProcCPU(os.Getpid())()
	if err != nil || s < 0 {
		t.Fatalf("own CPU seconds %v, %v", s, err)
	}
	if _, err := ProcCPU(1 << 30)(); err == nil {
		t.Fatal("a missing process was read")
	}
}

// With NextTurn every measured request extends a conversation the target saw in its
// warm-up: its messages start with an earlier request's messages (the previous turn
// plus an assistant answer and a new user message), and every client's conversation is
// its own.
func TestRunLoadNextTurn(t *testing.T) {
	type chat struct {
		Messages []struct{ Role, Content string }
	}
	var mu sync.Mutex
	seen := map[string]bool{} // every prefix of messages received so far, joined
	var extended, fresh int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c chat
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.Messages[len(c.Messages)-1].Role != "user" {
			http.Error(w, "bad body", 400)
			return
		}
		key := func(k int) string {
			var b strings.Builder
			for _, m := range c.Messages[:k] {
				b.WriteString(m.Role + "\x00" + m.Content + "\x00")
			}
			return b.String()
		}
		mu.Lock()
		if len(c.Messages) > 2 && seen[key(len(c.Messages)-2)] {
			extended++
		} else {
			fresh++
		}
		seen[key(len(c.Messages))] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	o := LoadOptions{Model: "m", Direct: HTTPTarget{Name: "direct", URLs: []string{srv.URL}},
		Routers:     []HTTPTarget{{Name: "r", URLs: []string{srv.URL}}},
		Concurrency: []int{1}, BodyBytes: []int{8 << 10}, Requests: 12, Distinct: 3, NextTurn: true}
	pts := RunLoad(context.Background(), o)
	if len(pts) != 1 || pts[0].Direct.Errors != 0 || pts[0].Routers[0].Errors != 0 {
		t.Fatalf("points %+v", pts)
	}
	// Direct's warm-up: 3 first turns (fresh); its 12 measured requests: turns 1–4 of
	// each conversation, each extending the one before. The router's warm-up repeats
	// the first turns (seen already: they extend nothing, so fresh) and its measured run
	// repeats direct's (each extends its previous turn).
	if fresh != 6 || extended != 24 {
		t.Fatalf("fresh %d, extended %d: want 6 first turns and 24 next turns", fresh, extended)
	}
}
