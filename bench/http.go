package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/sim"
)

// HTTPTarget is an OpenAI-compatible endpoint, or several that kvbench routes between
// itself (client-side random or round robin).
type HTTPTarget struct {
	Name  string
	URLs  []string // base URLs, e.g. http://127.0.0.1:8001
	Route string   // "" (one URL), "random", "round_robin"
}

// ErrTarget is wrapped by target parsing errors.
var ErrTarget = errors.New("bench: bad target")

// ParseTarget parses "NAME=URL" or "NAME=random:URL1,URL2,..." / "NAME=round_robin:URLS".
func ParseTarget(s string) (HTTPTarget, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || rest == "" {
		return HTTPTarget{}, fmt.Errorf("%w %q: want NAME=URL or NAME=random|round_robin:URL,URL,...", ErrTarget, s)
	}
	t := HTTPTarget{Name: name}
	for _, r := range clientPolicies {
		if strings.HasPrefix(rest, r+":") {
			t.Route, rest = r, strings.TrimPrefix(rest, r+":")
		}
	}
	for _, u := range strings.Split(rest, ",") {
		u = strings.TrimRight(strings.TrimSpace(u), "/")
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return HTTPTarget{}, fmt.Errorf("%w %q: %q is not an http(s) URL", ErrTarget, s, u)
		}
		t.URLs = append(t.URLs, u)
	}
	if t.Route == "" && len(t.URLs) != 1 {
		return HTTPTarget{}, fmt.Errorf("%w %q: several URLs need random: or round_robin:", ErrTarget, s)
	}
	return t, nil
}

// HTTPOptions configures an HTTP run.
type HTTPOptions struct {
	Arrivals Arrivals
	Model    string
	// API is "chat" (messages as stand-in text) or "tokens" (/v1/completions with the
	// engine's token ids as the prompt, which every tokenizer path of kvroute reads
	// exactly). Default "tokens".
	API      string
	Client   *http.Client
	Timeout  time.Duration // per request; 0 means 10 minutes
	Seed     uint64
	Progress func(done, total int)
}

// RunHTTP replays w against t in real time.
func RunHTTP(ctx context.Context, w *Workload, t HTTPTarget, o HTTPOptions) []Result {
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	results := make([]Result, len(w.Items))
	var mu sync.Mutex // guards rng, rr, done
	rng := rand.New(rand.NewPCG(o.Seed, 0x4854))
	rr, done := 0, 0
	pick := func() string {
		mu.Lock()
		defer mu.Unlock()
		switch t.Route {
		case "random":
			return t.URLs[rng.IntN(len(t.URLs))]
		case "round_robin":
			rr++
			return t.URLs[(rr-1)%len(t.URLs)]
		}
		return t.URLs[0]
	}
	start := time.Now()
	runChain := func(c []int) {
		for k, i := range c {
			if k > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(w.Items[i].Think):
				}
			}
			u := pick()
			results[i] = doRequest(ctx, o, u, &w.Items[i], start)
			results[i].Index = i
			if t.Route != "" {
				results[i].Worker = u
			}
			mu.Lock()
			done++
			if o.Progress != nil {
				o.Progress(done, len(w.Items))
			}
			mu.Unlock()
		}
	}
	cs := chains(w)
	var wg sync.WaitGroup
	if o.Arrivals.Kind == "streams" {
		ch := make(chan []int)
		for s := 0; s < o.Arrivals.Streams; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range ch {
					runChain(c)
				}
			}()
		}
		for _, c := range cs {
			select {
			case ch <- c:
			case <-ctx.Done():
			}
		}
		close(ch)
	} else {
		for _, c := range cs {
			at := start.Add(w.Items[c[0]].At)
			if d := time.Until(at); d > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
			}
			wg.Add(1)
			go func() { defer wg.Done(); runChain(c) }()
		}
	}
	wg.Wait()
	return results
}

type sseChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// doRequest sends one streaming request and measures it.
func doRequest(ctx context.Context, o HTTPOptions, base string, it *Item, runStart time.Time) Result {
	body := map[string]any{"max_tokens": it.MaxTokens, "ignore_eos": true, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	if o.Model != "" {
		body["model"] = o.Model
	}
	path := "/v1/completions"
	if o.API == "chat" && it.Messages != nil {
		path = "/v1/chat/completions"
		var msgs []map[string]any
		for _, m := range it.Messages {
			msgs = append(msgs, map[string]any{"role": m.Role, "content": sim.TokensText(m.Tokens)})
		}
		body["messages"] = msgs
	} else {
		body["prompt"] = it.EngineTokens()
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	sent := time.Now()
	r := Result{Start: sent.Sub(runStart)}
	fail := func(err string) Result {
		r.Err = err
		r.E2E = time.Since(sent)
		return r
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return fail(err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.Client.Do(req)
	if err != nil {
		return fail(err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fail(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg))))
	}
	if w := resp.Header.Get("x-gateway-destination-endpoint"); w != "" {
		r.Worker = w
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var first, last time.Time
	tokens := 0
	sawDone := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
			if ok {
				data = bytes.TrimSpace(data)
				if string(data) == "[DONE]" {
					sawDone = true
					break
				}
				var c sseChunk
				if json.Unmarshal(data, &c) == nil {
					for _, ch := range c.Choices {
						if ch.Text != "" || ch.Delta.Content != "" {
							now := time.Now()
							if first.IsZero() {
								first = now
							}
							last = now
							tokens++
						}
					}
					if c.Usage != nil {
						r.PromptTokens = c.Usage.PromptTokens
						r.OutputTokens = c.Usage.CompletionTokens
						if c.Usage.PromptTokensDetails != nil {
							r.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
						}
					}
				}
			}
		}
		if err != nil {
			break
		}
	}
	r.E2E = time.Since(sent)
	if !sawDone {
		return fail("stream ended without [DONE]")
	}
	if first.IsZero() {
		return fail("no content token")
	}
	r.TTFT = first.Sub(sent)
	if tokens > 1 {
		r.ITL = last.Sub(first) / time.Duration(tokens-1)
	}
	if r.PromptTokens == 0 {
		r.PromptTokens = len(it.EngineTokens())
	}
	if r.OutputTokens == 0 {
		r.OutputTokens = tokens
	}
	return r
}

// ScrapeCounter returns the sum of a counter's samples on a Prometheus /metrics page
// (e.g. vllm:request_success_total), for per-worker load spread behind a router.
func ScrapeCounter(ctx context.Context, c *http.Client, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			fmt.Sscan(line[i+1:], &v)
		}
		sum += v
	}
	return sum, sc.Err()
}
