package sim

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// startPDWorker runs a worker whose side channel (remote_host:remote_port) is its own
// HTTP listener, as cmd/vllm-sim sets it.
func startPDWorker(t *testing.T, opt WorkerOptions) (*Worker, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opt.SideChannel = ln.Addr().String()
	w, err := NewWorker(opt)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(w)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Runner.Run(ctx); close(done) }()
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return w, srv.URL
}

// prefillBody is the prefill leg as vLLM's toy proxy and llm-d's routing sidecar send
// it: kv_transfer_params with do_remote_decode and null remote fields, max_tokens 1,
// stream false.
const prefillBody = `{"model":"m","prompt":%s,"max_tokens":1,"stream":false,"kv_transfer_params":` +
	`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`

type prefillResp struct {
	ID               string          `json:"id"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

func prefill(t *testing.T, url, prompt string) prefillResp {
	t.Helper()
	resp := post(t, url+"/v1/completions", strings.Replace(prefillBody, "%s", prompt, 1))
	body := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, body)
	}
	var pr prefillResp
	if err := json.Unmarshal([]byte(body), &pr); err != nil {
		t.Fatal(err)
	}
	return pr
}

func decode(t *testing.T, url, prompt string, kv json.RawMessage) (cached int, body string) {
	t.Helper()
	resp := post(t, url+"/v1/completions", `{"model":"m","prompt":`+prompt+`,"max_tokens":3,"kv_transfer_params":`+string(kv)+`}`)
	body = readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("decode: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal([]byte(body), &out)
	return out.Usage.Details.Cached, body
}

// The whole NixlConnector exchange between a kv_producer and a kv_consumer worker: the
// prefill answers kv_transfer_params with vLLM's fields and holds its blocks; the
// decode reads them (charging the transfer, not a prefill), frees them on the prefill
// worker, announces the blocks as BlockStored and counts the tokens as
// external_kv_transfer; a second read of the same blocks fails and prefills locally.
func TestWorkersRunTheNixlExchange(t *testing.T) {
	p := pdProfile()
	p.NumBlocks = 256
	pw, purl := startPDWorker(t, WorkerOptions{Profile: p, Seed: 1, KVRole: KVRoleProducer, EngineID: "prefill-engine"})
	var mu sync.Mutex
	var stored int
	dw, durl := startPDWorker(t, WorkerOptions{Profile: p, Seed: 2, KVRole: KVRoleConsumer, PromptTokensDetails: true,
		OnBatch: func(b Batch) {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range b.Events {
				if ev.Kind == BlockStored {
					stored += len(ev.Hashes)
				}
			}
		}})
	prompt := tokenList(1, 40)

	pr := prefill(t, purl, prompt)
	var kv struct {
		DoRemotePrefill bool    `json:"do_remote_prefill"`
		DoRemoteDecode  bool    `json:"do_remote_decode"`
		BlockIDs        []int   `json:"remote_block_ids"`
		EngineID        string  `json:"remote_engine_id"`
		RequestID       string  `json:"remote_request_id"`
		Host            string  `json:"remote_host"`
		Port            int     `json:"remote_port"`
		TPSize          float64 `json:"tp_size"`
	}
	if err := json.Unmarshal(pr.KVTransferParams, &kv); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", pr.KVTransferParams, err)
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(purl, "http://"))
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.BlockIDs) != 3 || kv.EngineID != "prefill-engine" ||
		kv.RequestID != pr.ID || kv.Host != "127.0.0.1" || port != itoa(kv.Port) || kv.TPSize != 1 {
		t.Fatalf("kv_transfer_params %s: want NixlConnector's do_remote_prefill true, 3 block ids, engine, request id, this worker's host:port, tp_size 1", pr.KVTransferParams)
	}
	if s := pw.Runner.Stats(); s.HeldRequests != 1 {
		t.Fatalf("prefill worker holds %d requests, want 1", s.HeldRequests)
	}

	cached, body := decode(t, durl, prompt, pr.KVTransferParams)
	if cached != 39 {
		t.Fatalf("decode cached_tokens %d, want 39 (read, not prefilled): %s", cached, body)
	}
	if strings.Contains(body, "kv_transfer_params") {
		t.Fatalf("a decode response carries no kv_transfer_params: %s", body)
	}
	if s := pw.Runner.Stats(); s.HeldRequests != 0 {
		t.Fatal("the read must free the prefill worker's blocks")
	}
	src := scrapeRaw(t, durl)
	for _, want := range []string{`vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 39`,
		`vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 1`,
		`vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 0`} {
		if !strings.Contains(src, want) {
			t.Fatalf("decode /metrics lacks %s", want)
		}
	}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return stored == 2 }, "BlockStored of the 2 read full blocks")

	// Read again: the prefill worker holds nothing now. Local prefill, counted; the
	// 32 tokens the first read cached are a local hit.
	cached, _ = decode(t, durl, prompt, pr.KVTransferParams)
	if cached != 32 {
		t.Fatalf("after a failed read cached_tokens %d, want the local hit 32", cached)
	}
	if !strings.Contains(scrapeRaw(t, durl), `vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1`) {
		t.Fatal("a failed read must be counted")
	}
	if got := dw.Runner.Stats().KVTransferTokens; got != 39 {
		t.Fatalf("KVTransferTokens %d, want 39 from the one read", got)
	}
}

// A prefill whose blocks no decode worker reads frees them after KVHoldTimeout,
// counted as vllm:nixl_num_kv_expired_reqs_total.
func TestHeldKVExpires(t *testing.T) {
	pw, purl := startPDWorker(t, WorkerOptions{Profile: pdProfile(), Seed: 1, KVRole: KVRoleBoth, KVHoldTimeout: time.Millisecond})
	prefill(t, purl, tokenList(1, 40))
	waitFor(t, func() bool { return pw.Runner.Stats().HeldRequests == 0 }, "the hold to expire")
	if !strings.Contains(scrapeRaw(t, purl), `vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 1`) {
		t.Fatal("an expired hold must be counted")
	}
}

// Without a KV role kv_transfer_params are ignored (vLLM without a KV connector); with
// one, a malformed value is a 400 and invalid remote fields prefill locally, counted.
func TestKVParamsWithoutRoleAndMalformed(t *testing.T) {
	w, url := startPDWorker(t, WorkerOptions{Profile: pdProfile(), Seed: 1})
	pr := prefill(t, url, tokenList(1, 40))
	if len(pr.KVTransferParams) != 0 || w.Runner.Stats().HeldRequests != 0 {
		t.Fatalf("no role: kv_transfer_params %s, held %d; want none", pr.KVTransferParams, w.Runner.Stats().HeldRequests)
	}
	_, durl := startPDWorker(t, WorkerOptions{Profile: pdProfile(), Seed: 2, KVRole: KVRoleConsumer})
	if resp := post(t, durl+"/v1/completions", `{"model":"m","prompt":[1,2],"kv_transfer_params":"yes"}`); resp.StatusCode != 400 {
		t.Fatalf("malformed kv_transfer_params: %d, want 400", resp.StatusCode)
	}
	decode(t, durl, tokenList(1, 40), json.RawMessage(`{"do_remote_prefill":true,"remote_block_ids":[1,2,3]}`))
	if !strings.Contains(scrapeRaw(t, durl), `vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1`) {
		t.Fatal("do_remote_prefill without the remote fields must prefill locally, counted")
	}
	if _, err := NewWorker(WorkerOptions{Profile: pdProfile(), KVRole: "prefill"}); err == nil {
		t.Fatal("an unknown kv role must be refused")
	}
}

func tokenList(start, n int) string {
	b, _ := json.Marshal(seqTokens(start, n))
	return string(b)
}

func itoa(n int) string { return strconv.Itoa(n) }

func scrapeRaw(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond: the state it waits for comes from the worker's own goroutines.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
