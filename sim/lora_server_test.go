package sim

import (
	"bufio"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/workers"
)

// A worker serving adapters (vLLM --lora-modules, --max-loras) runs a request naming
// one with that adapter, lists the adapters in /v1/models, and exports
// vllm:lora_requests_info in the shape kvroute's scraper reads.
func TestWorkerServesLoRAModules(t *testing.T) {
	p := testProfile()
	p.StepOverhead, p.PrefillPerToken, p.DecodePerSeq = time.Millisecond, 1000, 1000
	p.NumBlocks, p.MaxLoRAs, p.LoRALoadTime = 8192, 2, time.Millisecond
	w, url := startWorkerWith(t, WorkerOptions{Profile: p, Model: "m", Seed: 7, LoRAModules: []string{"sql", "chat"}})

	resp := post(t, url+"/v1/completions", `{"model":"sql","prompt":[5,6,7,8],"max_tokens":2}`)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"model":"sql"`) {
		t.Fatalf("adapter request: %d %s", resp.StatusCode, body)
	}
	if resp := post(t, url+"/v1/completions", `{"model":"nope","prompt":[5],"max_tokens":1}`); resp.StatusCode != 404 {
		t.Fatalf("unknown adapter: %d, want 404", resp.StatusCode)
	}
	mresp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if models := readAll(t, mresp); !strings.Contains(models, `"id":"chat"`) || !strings.Contains(models, `"parent":"m"`) {
		t.Fatalf("/v1/models: %s", models)
	}

	// While a long chat-adapter request streams, the scrape lists chat running.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"model":"chat","prompt":[9,10,11],"max_tokens":100000,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}
	l := scrape(t, url)
	if a := l.Adapters; a.MaxLoRAs != 2 || !slices.Equal(a.Running, []string{"chat"}) || len(a.Waiting) != 0 {
		t.Fatalf("scraped adapters %+v, want running [chat], max 2", a)
	}
	if got := w.Runner.Stats().LoRALoads; got != 2 {
		t.Fatalf("loads %d, want 2 (sql, chat)", got)
	}
}

func scrape(t *testing.T, url string) workers.Load {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	l, err := workers.ParseLoad(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
	}
	return b.String()
}

func TestWorkerLoRAModulesNeedSlots(t *testing.T) {
	if _, err := NewWorker(WorkerOptions{Profile: testProfile(), LoRAModules: []string{"a"}}); err == nil {
		t.Fatal("adapters without max_loras must be refused")
	}
}
