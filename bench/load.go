package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LoadOptions configures a load sweep (kvbench --load): the same streaming chat
// requests sent straight to the workers and through a router, at each body size and
// concurrency, to measure what the router adds.
type LoadOptions struct {
	Direct      HTTPTarget // the workers themselves (round robin or random over them)
	Routers     []HTTPTarget
	Model       string
	Concurrency []int // closed-loop clients per point
	BodyBytes   []int // approximate chat body size per point
	Requests    int   // requests per target and point (at least 2 × concurrency)
	Distinct    int   // distinct bodies per size, cycled (0: 16)
	// NextTurn sends each conversation's next turn instead of repeating its body: every
	// request to a conversation is the previous one plus the assistant's answer and a
	// new user message (~1 KB of new text), the shape of an agent's next call. A point
	// holds max(Distinct, concurrency) conversations; each target's warm-up sends every
	// conversation's first turn, so the measured requests are all next turns of a
	// conversation that target has seen.
	NextTurn bool
	// RouterCPU returns the router process's CPU seconds so far (/proc/PID/stat or its
	// process_cpu_seconds_total); nil: not measured. Index by router target.
	RouterCPU []func() (float64, error)
	Client    *http.Client
	Timeout   time.Duration // per request; 0: 2 minutes
	Seed      uint64
}

// LoadSample is one target's figures at one point.
type LoadSample struct {
	Target     string        `json:"target"`
	Requests   int           `json:"requests"`
	Errors     int           `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	TTFTp50    time.Duration `json:"ttft_p50_ns"`
	TTFTp99    time.Duration `json:"ttft_p99_ns"`
	E2Ep50     time.Duration `json:"e2e_p50_ns"`
	RPS        float64       `json:"rps"`
	// CPUPerRequest is the router process's CPU seconds per request during the target's
	// run (−1 unmeasured).
	CPUPerRequest float64 `json:"cpu_s_per_request"`
}

// SweepPoint is one (body size, concurrency) point: the direct run and every router's,
// with the router's added TTFT = its percentile − the direct run's percentile.
type SweepPoint struct {
	BodyBytes   int             `json:"body_bytes"`
	Concurrency int             `json:"concurrency"`
	Direct      LoadSample      `json:"direct"`
	Routers     []LoadSample    `json:"routers"`
	AddedP50    []time.Duration `json:"added_ttft_p50_ns"`
	AddedP99    []time.Duration `json:"added_ttft_p99_ns"`
}

// ChatBody returns a streaming chat request of about n bytes: a system prompt and
// alternating user/assistant turns of ~1 KB (the shape of an agent's context), made
// distinct by variant from its first message on.
func ChatBody(model string, n, variant int, seed uint64) []byte {
	return newConversation(model, n, variant, seed, 0).body(0)
}

// conversation is one chat of about n bytes (ChatBody's shape) and `turns` next turns:
// body(k) is the chat plus the first k (assistant answer, new user message) pairs, each
// body a prefix of the next one's messages.
type conversation struct {
	head  []byte   // {"model":…,"messages":[ and the first messages
	turns [][]byte // `,{assistant},{user}` per next turn
}

func newConversation(model string, n, variant int, seed uint64, turns int) *conversation {
	rng := rand.New(rand.NewPCG(seed, uint64(variant)))
	words := strings.Fields(loadWords)
	text := func(size int) string {
		var b strings.Builder
		for b.Len() < size {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", fmt.Sprintf("Session %d. ", variant) + text(min(n/4, 2048))}}
	size := 200 + len(msgs[0].Content)
	for i := 0; size < n; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		c := text(min(1024, max(n-size-40, 16)))
		msgs = append(msgs, msg{role, c})
		size += len(c) + 40
	}
	if msgs[len(msgs)-1].Role != "user" {
		msgs = append(msgs, msg{"user", "Continue."})
	}
	head, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 2,
		"stream_options": map[string]any{"include_usage": true}})
	head = append(head[:len(head)-1], `,"messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			head = append(head, ',')
		}
		b, _ := json.Marshal(m)
		head = append(head, b...)
	}
	c := &conversation{head: head, turns: make([][]byte, turns)}
	for k := range c.turns {
		a, _ := json.Marshal(msg{"assistant", text(300)})
		u, _ := json.Marshal(msg{"user", fmt.Sprintf("Step %d. ", k+1) + text(700)})
		c.turns[k] = append(append(append([]byte{','}, a...), ','), u...)
	}
	return c
}

// body returns the conversation with its first k next turns.
func (c *conversation) body(k int) []byte {
	n := len(c.head) + 2
	for _, t := range c.turns[:k] {
		n += len(t)
	}
	b := append(make([]byte, 0, n), c.head...)
	for _, t := range c.turns[:k] {
		b = append(b, t...)
	}
	return append(b, "]}"...)
}

const loadWords = `the of and to in is that for it as with was on be by this are or from at an but not have which
has were can all their more one will would there been if its when into only other new some could time these two may
then do first any my now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another know while last might us great old
year off come since against go came right used take three function return const value error nil struct package import
type interface string int64 float64 bytes buffer request response worker router prefix cache block token model`

// RunLoad runs the sweep: for each body size and concurrency, Requests requests to the
// direct target, then to each router, closed loop (each client sends its next request
// when the previous one ended), bodies cycled.
func RunLoad(ctx context.Context, o LoadOptions) []SweepPoint {
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 4096, DisableCompression: true}}
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Distinct <= 0 {
		o.Distinct = 16
	}
	var out []SweepPoint
	for _, size := range o.BodyBytes {
		for _, c := range o.Concurrency {
			n := max(o.Requests, 2*c)
			warm, body := o.bodies(size, c, n)
			pt := SweepPoint{BodyBytes: len(body(0, false)), Concurrency: c}
			run(ctx, o, o.Direct, body, true, c, warm) // warm connections and caches
			pt.Direct = run(ctx, o, o.Direct, body, false, c, n)
			pt.Direct.CPUPerRequest = -1
			for k, rt := range o.Routers {
				run(ctx, o, rt, body, true, c, warm)
				var cpu0 float64
				var cpuErr error = fmt.Errorf("unmeasured")
				if k < len(o.RouterCPU) && o.RouterCPU[k] != nil {
					cpu0, cpuErr = o.RouterCPU[k]()
				}
				s := run(ctx, o, rt, body, false, c, n)
				s.CPUPerRequest = -1
				if cpuErr == nil {
					if cpu1, err := o.RouterCPU[k](); err == nil && s.Requests > 0 {
						s.CPUPerRequest = (cpu1 - cpu0) / float64(s.Requests)
					}
				}
				pt.Routers = append(pt.Routers, s)
				pt.AddedP50 = append(pt.AddedP50, s.TTFTp50-pt.Direct.TTFTp50)
				pt.AddedP99 = append(pt.AddedP99, s.TTFTp99-pt.Direct.TTFTp99)
			}
			out = append(out, pt)
		}
	}
	return out
}

// bodyFunc returns the i-th request's body of a target's warm-up or measured run.
type bodyFunc func(i int, warm bool) []byte

// bodies returns the warm-up's request count and the bodies of one point: Distinct
// bodies cycled, or with NextTurn one conversation per client (at least Distinct),
// whose first turn is the warm-up's and whose next turns are the measured run's.
func (o LoadOptions) bodies(size, c, n int) (int, bodyFunc) {
	if !o.NextTurn {
		bodies := make([][]byte, o.Distinct)
		for i := range bodies {
			bodies[i] = ChatBody(o.Model, size, i, o.Seed)
		}
		return min(c, n), func(i int, _ bool) []byte { return bodies[i%len(bodies)] }
	}
	d := max(o.Distinct, c)
	convs := make([]*conversation, d)
	for i := range convs {
		convs[i] = newConversation(o.Model, size, i, o.Seed, (n+d-1)/d)
	}
	return d, func(i int, warm bool) []byte {
		if warm {
			return convs[i%d].body(0)
		}
		return convs[i%d].body(1 + i/d)
	}
}

// run sends n requests to t from c clients and summarizes them.
func run(ctx context.Context, o LoadOptions, t HTTPTarget, body bodyFunc, warm bool, c, n int) LoadSample {
	var next, rr atomic.Int64
	var mu sync.Mutex
	var ttft, e2e []time.Duration
	s := LoadSample{Target: t.Name}
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				base := t.URLs[0]
				if len(t.URLs) > 1 {
					base = t.URLs[int(rr.Add(1)-1)%len(t.URLs)]
				}
				ft, et, err := streamOnce(ctx, o, base, body(i, warm))
				mu.Lock()
				s.Requests++
				if err != nil {
					s.Errors++
					if s.FirstError == "" {
						s.FirstError = err.Error()
					}
				} else {
					ttft, e2e = append(ttft, ft), append(e2e, et)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if el := time.Since(start).Seconds(); el > 0 {
		s.RPS = float64(s.Requests-s.Errors) / el
	}
	s.TTFTp50, s.TTFTp99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
	s.E2Ep50 = quantile(e2e, 0.5)
	return s
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[min(int(q*float64(len(ds))), len(ds)-1)]
}

// streamOnce posts body and returns the time to the first SSE data line with content
// and to the end of the stream ([DONE]).
func streamOnce(ctx context.Context, o LoadOptions, base string, body []byte) (ttft, e2e time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := o.Client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return 0, 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, rerr := br.ReadSlice('\n')
		if d, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			d = bytes.TrimSpace(d)
			if string(d) == "[DONE]" {
				if ttft == 0 {
					return 0, 0, fmt.Errorf("stream without content")
				}
				return ttft, time.Since(sent), nil
			}
			if ttft == 0 && bytes.Contains(d, []byte(`"content":"`)) {
				ttft = time.Since(sent)
			}
		}
		if rerr == bufio.ErrBufferFull {
			continue
		}
		if rerr != nil {
			return 0, 0, fmt.Errorf("stream ended without [DONE]: %v", rerr)
		}
	}
}

// FormatLoad renders points as a Markdown table (milliseconds; CPU in ms·core per
// request).
func FormatLoad(pts []SweepPoint) string {
	var b strings.Builder
	b.WriteString("| body | conc. | target | req | err | TTFT p50 | TTFT p99 | added p50 | added p99 | req/s | CPU/req |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
	for _, p := range pts {
		size := fmt.Sprintf("%d KB", (p.BodyBytes+512)/1024)
		row := func(s LoadSample, a50, a99 string) {
			cpu := "—"
			if s.CPUPerRequest >= 0 {
				cpu = fmt.Sprintf("%.2f ms·core", s.CPUPerRequest*1e3)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %s | %s | %s | %s | %.0f | %s |\n", size, p.Concurrency, s.Target,
				s.Requests, s.Errors, ms(s.TTFTp50), ms(s.TTFTp99), a50, a99, s.RPS, cpu)
		}
		row(p.Direct, "", "")
		for k, s := range p.Routers {
			row(s, ms(p.AddedP50[k]), ms(p.AddedP99[k]))
		}
	}
	return b.String()
}

// ProcCPU reads a process's user+system CPU seconds from /proc/PID/stat (fields 14 and
// 15, in clock ticks of 1/100 s: USER_HZ is 100 on every Linux architecture Go targets).
func ProcCPU(pid int) func() (float64, error) {
	return func() (float64, error) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		// The command name (field 2) is parenthesized and may hold spaces: split after it.
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 {
			return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
		}
		f := strings.Fields(string(raw[i+1:])) // f[0] is field 3 (state)
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
		}
		ut, err1 := strconv.ParseFloat(f[11], 64)
		st, err2 := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
		}
		return (ut + st) / 100, nil
	}
}

// MetricsCPU reads process_cpu_seconds_total from a Prometheus /metrics URL (kvroute's
// admin port).
func MetricsCPU(c *http.Client, url string) func() (float64, error) {
	return func() (float64, error) {
		return ScrapeCounter(context.Background(), c, url, "process_cpu_seconds_total")
	}
}
