// Command vllm-sim runs one or more simulated vLLM workers: the OpenAI API with SSE
// streaming, Anthropic's /v1/messages as vLLM serves it, /tokenize, /metrics with vLLM's metric names, /health, /reset_prefix_cache,
// and vLLM KV cache events over ZMQ (PUB + ROUTER replay). Worker i listens on
// --port+i and publishes on --kv-port+i (replay on --kv-replay-port+i).
//
//	vllm-sim --workers 3 --port 8001 --kv-port 5557 --profile l40s-27b
//	vllm-sim --workers 3 --port 8001 --kv-port 0 --echo   # instant answers, for `make loadtest`
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	n := fs.Int("workers", 1, "number of workers (consecutive ports)")
	host := fs.String("host", "127.0.0.1", "address to listen on (HTTP and KV events)")
	port := fs.Int("port", 8000, "HTTP port of worker 0")
	kvPort := fs.Int("kv-port", 5557, "KV events PUB port of worker 0 (0: no events)")
	replayPort := fs.Int("kv-replay-port", 5567, "KV events replay ROUTER port of worker 0 (0: no replay)")
	kvMode := fs.String("kv-mode", "bind", `PUB socket: "bind" on --host, or "connect" to --kv-endpoint`)
	kvEndpoint := fs.String("kv-endpoint", "", `with --kv-mode=connect: the subscriber's endpoint for worker 0, e.g. tcp://127.0.0.1:5557 (port+i per worker)`)
	kvFormat := fs.String("kv-format", "map", `event format: "map" (vLLM >= 0.26) or "array" (legacy)`)
	topic := fs.String("kv-topic", "", "topic frame of every event message")
	profile := fs.String("profile", "l40s-27b", fmt.Sprintf("engine profile %v", sim.ProfileNames()))
	model := fs.String("model", "", "served model name (default: the profile's)")
	seed := fs.Uint64("seed", 0, "block-hash seed (0: random per process, like vLLM without PYTHONHASHSEED); worker i uses seed+i")
	details := fs.Bool("enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	blocks := fs.Int("num-gpu-blocks", 0, "override the profile's KV capacity in blocks")
	maxSeqs := fs.Int("max-num-seqs", 0, "override max_num_seqs")
	maxBatch := fs.Int("max-num-batched-tokens", 0, "override max_num_batched_tokens")
	tokDir := fs.String("tokenizer", "", "directory with tokenizer.json (+ chat template), e.g. .cache/tokenizers/gemma3 from scripts/fetch-tokenizers.sh; default: the stand-in tokenizer (one token per word, t123 = token 123)")
	defMax := fs.Int("default-max-tokens", 16, "max_tokens when a request sets none")
	echo := fs.Bool("echo", false, "zero engine time (load tests of kvroute itself): completions are answered at once, streamed when the body sets \"stream\": true, with --echo-tokens chunks; /tokenize, /metrics and /health stay the simulated worker's")
	echoTokens := fs.Int("echo-tokens", 2, "--echo: content chunks per response (the first is flushed on its own)")
	loraModules := fs.String("lora-modules", "", "comma-separated LoRA adapters served on top of the model, NAME or NAME=PATH as vLLM's --lora-modules (the path is ignored); needs --max-loras")
	maxLoras := fs.Int("max-loras", 0, "vLLM --max-loras: adapters held in GPU slots, distinct adapters per engine step")
	loraLoad := fs.Duration("lora-load-time", 200*time.Millisecond, "time one adapter load adds to the engine step that loads it")
	kvRole := fs.String("kv-role", "", `P/D through vLLM's NixlConnector (kv_transfer_config kv_role): "kv_producer" (prefill worker: do_remote_decode requests hold their KV and answer kv_transfer_params), "kv_consumer" (decode worker: do_remote_prefill requests read it instead of prefilling) or "kv_both"; "" ignores kv_transfer_params`)
	kvBytes := fs.Float64("kv-bytes-per-token", 0, "KV bytes of one token per GPU, for the transfer time (0: the profile's, from its model)")
	kvBandwidth := fs.Float64("kv-transfer-bytes-per-second", 25e9, "bandwidth a decode worker reads a prefill worker's KV at (25e9: one 200 Gb/s RDMA NIC; 0: no bandwidth term)")
	kvLatency := fs.Duration("kv-transfer-latency", 0, "fixed time added to each KV read of a decode worker")
	kvHold := fs.Duration("kv-hold-timeout", sim.DefaultKVHoldTimeout, "a prefill worker frees KV no decode worker read after this (vLLM VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	disagree := fs.Bool("tokenize-disagree", false, "POST /tokenize answers wrong ids on purpose (the last id changed), to test a router's shadow check; generation is unaffected")
	ping := fs.Bool("anthropic-ping", false, "/v1/messages streams carry a ping event after content_block_start, as Anthropic's API sends (vLLM sends none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	prof, err := sim.LookupProfile(*profile)
	if err != nil {
		return err
	}
	if *blocks > 0 {
		prof.NumBlocks = *blocks
	}
	if *maxSeqs > 0 {
		prof.MaxNumSeqs = *maxSeqs
	}
	if *maxBatch > 0 {
		prof.MaxBatchTokens = *maxBatch
	}
	prof.MaxLoRAs, prof.LoRALoadTime = *maxLoras, *loraLoad
	if *kvBytes > 0 {
		prof.KVBytesPerToken = *kvBytes
	}
	prof.KVTransferBytesPerSecond, prof.KVTransferLatency = *kvBandwidth, *kvLatency
	adapters, err := parseLoRAModules(*loraModules)
	if err != nil {
		return err
	}
	if len(adapters) > 0 && *maxLoras <= 0 {
		return errors.New("--lora-modules needs --max-loras ≥ 1")
	}
	var enc sim.Encoder = sim.MapEncoder{}
	switch *kvFormat {
	case "map":
	case "array":
		enc = sim.ArrayEncoder{}
	default:
		return fmt.Errorf("--kv-format must be map or array, got %q", *kvFormat)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var textTokens func(bool, []byte) ([]uint32, error)
	if *tokDir != "" {
		if textTokens, err = realTokens(*tokDir, cmpOr(*model, prof.Model)); err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var servers []*http.Server
	var pubs []*sim.Publisher
	var wg sync.WaitGroup
	defer func() {
		for _, p := range pubs {
			_ = p.Close()
		}
	}()
	for i := 0; i < *n; i++ {
		opt := sim.WorkerOptions{Profile: prof, Model: *model, PromptTokensDetails: *details, DefaultMaxTokens: *defMax, TextTokens: textTokens,
			TokenizeDisagree: *disagree, LoRAModules: adapters, KVRole: *kvRole, KVHoldTimeout: *kvHold, AnthropicPing: *ping}
		if *seed != 0 {
			opt.Seed = *seed + uint64(i)
		}
		if *kvPort > 0 {
			po := sim.PublisherOptions{Topic: *topic, Encoder: enc, Mode: *kvMode,
				Endpoint: fmt.Sprintf("tcp://%s:%d", *host, *kvPort+i)}
			if *kvMode == "connect" {
				if *kvEndpoint == "" {
					return errors.New("--kv-mode=connect needs --kv-endpoint")
				}
				h, p, err := net.SplitHostPort(trimScheme(*kvEndpoint))
				if err != nil {
					return fmt.Errorf("--kv-endpoint: %w", err)
				}
				var pn int
				fmt.Sscan(p, &pn)
				po.Endpoint = fmt.Sprintf("tcp://%s:%d", h, pn+i)
			}
			if *replayPort > 0 {
				po.ReplayEndpoint = fmt.Sprintf("tcp://%s:%d", *host, *replayPort+i)
			}
			pub, err := sim.NewPublisher(po)
			if err != nil {
				return err
			}
			pubs = append(pubs, pub)
			opt.OnBatch = func(b sim.Batch) {
				if err := pub.Publish(b); err != nil {
					log.Warn("kv events publish", "err", err)
				}
			}
		}
		addr := net.JoinHostPort(*host, fmt.Sprint(*port+i))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		opt.SideChannel = ln.Addr().String() // remote_host:remote_port of its prefill responses
		w, err := sim.NewWorker(opt)
		if err != nil {
			return err
		}
		var h http.Handler = w
		if *echo {
			h = &echoHandler{next: w, model: cmpOr(*model, prof.Model), tokens: max(*echoTokens, 1)}
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		wg.Add(2)
		go func() { defer wg.Done(); w.Runner.Run(ctx) }()
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serve", "addr", addr, "err", err)
			}
		}()
		attrs := []any{"worker", i, "http", addr, "profile", prof.Name, "model", cmpOr(opt.Model, prof.Model)}
		if len(pubs) > i {
			attrs = append(attrs, "kv_events", pubs[i].PubAddr, "replay", pubs[i].ReplayAddr)
		}
		log.Info("vllm-sim worker ready", attrs...)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	wg.Wait()
	return nil
}

func trimScheme(ep string) string {
	for _, p := range []string{"tcp://"} {
		if len(ep) > len(p) && ep[:len(p)] == p {
			return ep[len(p):]
		}
	}
	return ep
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parseLoRAModules parses --lora-modules: comma-separated NAME or NAME=PATH.
func parseLoRAModules(s string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		name, _, _ := strings.Cut(m, "=")
		if name = strings.TrimSpace(name); name == "" || slices.Contains(out, name) {
			return nil, fmt.Errorf("--lora-modules: %q: want distinct NAME or NAME=PATH entries", m)
		}
		out = append(out, name)
	}
	return out, nil
}
