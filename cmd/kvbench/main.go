// Command kvbench runs a workload (shared prefix, multi-turn, Mooncake trace replay)
// against OpenAI endpoints over HTTP, or against a virtual-time cluster of simulated
// vLLM engines behind kvroute's router core with every scoring policy, and reports
// TTFT/E2E percentiles, goodput, cache hits against their bound, load spread and
// prediction error as a table, JSON and SVG plots.
//
//	kvbench --workload shared-prefix --sweep poisson:0.5,1,2          # virtual time, all policies
//	kvbench --http kvroute=http://127.0.0.1:9000 \
//	        --http random=random:http://127.0.0.1:8001,http://127.0.0.1:8002 --arrivals poisson:1
//	kvbench --load --http direct=round_robin:http://127.0.0.1:8001,http://127.0.0.1:8002 \
//	        --http kvroute=http://127.0.0.1:9000 --concurrency 1,200 --body-sizes 4k,220k  # make loadtest
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/sim"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	workload := fs.String("workload", "shared-prefix", "shared-prefix, multi-turn, lora, pd (prefill/decode disaggregation) or trace")
	seed := fs.Uint64("seed", 1, "seed of the workload, arrivals and policies")
	requests := fs.Int("requests", 300, "shared-prefix: requests")
	prefixes := fs.Int("prefixes", 8, "shared-prefix: K prefixes")
	prefixTok := fs.Int("prefix-tokens", 6000, "shared-prefix: P tokens per prefix (system message)")
	suffixTok := fs.Int("suffix-tokens", 200, "shared-prefix: S unique user tokens")
	skew := fs.Float64("prefix-skew", 0, "shared-prefix: Zipf exponent (> 1) for prefix popularity; 0 uniform")
	outputTok := fs.Int("output-tokens", 64, "output tokens per request (ignore_eos)")
	convs := fs.Int("conversations", 40, "multi-turn: conversations")
	turns := fs.Int("turns", 6, "multi-turn: turns per conversation")
	sysTok := fs.Int("system-tokens", 1000, "multi-turn: shared system prompt tokens")
	userTok := fs.Int("user-tokens", 300, "multi-turn: user tokens per turn")
	adapters := fs.Int("adapters", 64, "lora: LoRA adapters (each with its own --system-tokens system prompt)")
	adapterSkew := fs.Float64("adapter-skew", 1.1, "lora: Zipf exponent (> 1) of adapter popularity; ≤ 1 uniform")
	maxLoras := fs.Int("max-loras", 8, "lora, virtual: each engine's --max-loras")
	loraLoad := fs.Duration("lora-load-time", 200*time.Millisecond, "lora, virtual: the engines' adapter load time")
	think := fs.Duration("think", 2*time.Second, "multi-turn: pause between a reply and the next turn")
	tracePath := fs.String("trace", "", "trace: Mooncake-format JSONL file, gzipped when it ends in .gz (default "+bench.DefaultTracePath+")")
	speed := fs.Float64("speed", 1, "trace: time compression factor")
	limit := fs.Int("limit", 0, "trace: first N requests (0 all)")
	maxDur := fs.Duration("max-duration", 0, "trace: drop arrivals after this (0 none)")
	arrivals := fs.String("arrivals", "poisson:1", "constant:R, poisson:R, streams:N, trace, or trace:D (each trace arrival delayed by a uniform draw in [0, D): trace:3s undoes the Mooncake trace's 3 s timestamp rounding at --speed 1)")
	sweep := fs.String("sweep", "", "several loads, e.g. poisson:0.5,1,2 or streams:4,16 (overrides --arrivals)")
	var targets multi
	fs.Var(&targets, "http", "HTTP target NAME=URL or NAME=random:URL,URL / NAME=round_robin:URL,URL (repeatable); none → virtual time")
	api := fs.String("api", "tokens", "HTTP: tokens (/v1/completions with token ids) or chat (/v1/chat/completions, stand-in text)")
	model := fs.String("model", "", "HTTP: model field (default: the profile's model)")
	resetURLs := fs.String("reset", "", "HTTP: comma-separated worker base URLs to POST /reset_prefix_cache before each target (cold caches for every policy)")
	workerMetrics := fs.String("worker-metrics", "", "HTTP: comma-separated worker /metrics URLs for per-worker load spread")
	nworkers := fs.Int("workers", 3, "virtual: workers")
	profile := fs.String("profile", "l40s-27b", fmt.Sprintf("virtual: engine profile %v", sim.ProfileNames()))
	numBlocks := fs.Int("num-gpu-blocks", 0, "virtual: override the profile's KV capacity in blocks")
	policies := fs.String("policies", "all", "virtual: comma-separated scoring policies, or all")
	lag := fs.Duration("event-lag", 5*time.Millisecond, "virtual: KV event delay from engine to index")
	slo := fs.Duration("slo", 8*time.Second, "TTFT objective for goodput (and for --admission, --flow-control)")
	admMode := fs.String("admission", "", "virtual: also run kvroute behind SLO admission with objective --slo, as `kvroute serve` decides it (admission.Policy): refuse (answer 429 at arrival when no worker is predicted to start the request within --slo)")
	highShare := fs.Float64("priority-share", 0, "virtual, --admission refuse: this share of requests is in a class \"high\" of priority 10 (objective --slo, attainment --priority-attainment); adds a run with the same split and no priority")
	highAtt := fs.Float64("priority-attainment", 0.95, "virtual, --priority-share: the high class's slo_attainment")
	flashFlag := fs.String("flash-crowd", "", "virtual: START:DURATION:FACTOR, e.g. 60s:60s:10: arrivals FACTOR times as fast for DURATION from START (the workload's timeline compressed), then at their own rate; reports SLO attainment per 10 s window and the recovery time after the burst")
	flowControl := fs.Bool("flow-control", false, "virtual: also run an llm-d-style flow-control baseline: llmd_prefix_affinity behind kvroute's queue, a request waits while the worker it would get is saturated, TTL --slo")
	out := fs.String("out", "bench-out", "directory for report.json and SVG plots")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (terminal only), always, never")
	keep := fs.Bool("keep-results", false, "include per-request results in report.json")
	lf := addLoadFlags(fs)
	pf := addPDFlags(fs)
	speedsFlag := fs.String("worker-speeds", "", "virtual: true speed factor per worker, e.g. 1,1,2,3 (step time ÷ factor; missing = 1)")
	var slowFlags multi
	fs.Var(&slowFlags, "slow", "virtual: W:AT:F makes worker W (0-based) F times slower from AT, e.g. 0:2m:3 (repeatable)")
	utilBacklog := fs.Bool("utilization-backlog", false, "virtual: kvroute scales its utilization ρ by offered ÷ served tokens (scoring.utilization_backlog)")
	kvWait := fs.Bool("kv-wait", false, "virtual: kvroute prices a KV-full worker's queue by the time its running requests take to free the blocks (scoring.kv_wait)")
	cacheTurnover := fs.Bool("cache-turnover", false, "virtual: kvroute prices the cache copy a pick loses to its worker's cache turnover (scoring.cache_turnover)")
	knownSpeeds := fs.Bool("known-speeds", false, "virtual: the registry's worker profiles carry the true speeds (default: all configured alike)")
	nreplicas := fs.Int("replicas", 1, "virtual: kvroute replicas, arrivals spread over them round robin (each its own index, bookings and policy state)")
	blind := fs.Bool("blind", false, "virtual, --replicas > 1: replicas do not exchange bookings (peers empty)")
	exDelay := fs.Duration("exchange-delay", 0, "virtual, --replicas > 1: transit time of a booking summary between replicas")
	exSync := fs.Bool("exchange-sync", false, "virtual, --replicas > 1: also send each replica's summary to its peers at once after every pick (the ideal exchange)")
	peerState := fs.Bool("peer-state", false, "virtual, --replicas > 1: the policies count peers' left requests and cache writes (scoring.peer_state)")
	exInterval := fs.Duration("exchange-interval", 25*time.Millisecond, "virtual, --replicas > 1: coalescing period of the summaries (peers.interval)")
	qos := fs.String("qos", "", fmt.Sprintf("virtual: QoS comparison instead of the policy runs, one of %v (kvroute's queue, admission.FairQueue, in virtual time); prints a table", bench.QoSScenarios))
	qosShare := fs.Float64("qos-share", 0.9, "qos: share of requests from the flooding (flood) or high-priority (priority) tenant")
	qosObjective := fs.Duration("qos-objective", 2*time.Second, "qos: the class TTFT objective (wait while no worker is predicted within it)")
	qosMaxQueue := fs.Duration("qos-max-queue", 60*time.Second, "qos: the class max_queue_time (past it: queue_timeout)")
	nseeds := fs.Int("seeds", 1, "run seeds seed..seed+N-1 and report mean ± sd per policy and load")
	scoreboard := fs.Bool("scoreboard", false, "run the scoreboard (every workload, all policies, several seeds) and write scoreboard.md")
	rowsFlag := fs.String("rows", "", "scoreboard: only rows whose key matches this regular expression")
	traceSeeds := fs.Int("trace-seeds", 1, "scoreboard: seeds of the Mooncake rows")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "scoreboard: concurrent virtual runs")
	doc := fs.String("doc", "", "scoreboard: markdown file whose section between the scoreboard markers is regenerated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *lf.on {
		return runLoad(lf, targets, *model, *out, *seed)
	}
	prof, err := sim.LookupProfile(*profile)
	if err != nil {
		return err
	}
	if *model == "" {
		*model = prof.Model
	}
	if *numBlocks > 0 {
		prof.NumBlocks = *numBlocks
	}
	if *workload == "lora" {
		prof.MaxLoRAs, prof.LoRALoadTime = *maxLoras, *loraLoad
	}
	roles, err := pf.roles(*workload, *nworkers, &prof)
	if err != nil {
		return err
	}
	var flash *bench.FlashCrowd
	if *flashFlag != "" {
		f, err := bench.ParseFlashCrowd(*flashFlag)
		if err != nil {
			return err
		}
		flash = &f
	}
	speeds, err := bench.ParseSpeeds(*speedsFlag)
	if err != nil {
		return err
	}
	var slows []bench.Slowdown
	for _, sl := range slowFlags {
		sd, err := bench.ParseSlowdown(sl)
		if err != nil {
			return err
		}
		slows = append(slows, sd)
	}
	if *scoreboard {
		sbSeeds := 0 // each row's own seed count unless --seeds is given
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "seeds" {
				sbSeeds = *nseeds
			}
		})
		return runScoreboard(scoreboardArgs{cacheTurnover: *cacheTurnover, utilBacklog: *utilBacklog, kvWait: *kvWait, trace: *tracePath, seeds: sbSeeds, traceSeeds: *traceSeeds, rows: *rowsFlag,
			parallel: *parallel, policies: *policies, lag: *lag, out: *out, doc: *doc, args: args})
	}
	if *nseeds < 1 {
		return fmt.Errorf("--seeds %d: want ≥ 1", *nseeds)
	}
	var traceW *bench.Workload
	if *workload == "trace" {
		if *tracePath == "" {
			*tracePath = bench.DefaultTracePath
		}
		f, err := bench.OpenTrace(*tracePath)
		if err != nil {
			return err
		}
		traceW, err = bench.ParseMooncake(f, bench.TraceOptions{Limit: *limit, Speed: *speed, MaxDuration: *maxDur})
		f.Close()
		if err != nil {
			return err
		}
		if !strings.Contains(*sweep, ":") && *arrivals == "poisson:1" {
			*arrivals = "trace"
		}
	}
	build := func(seed uint64) (*bench.Workload, error) {
		switch *workload {
		case "shared-prefix":
			return bench.SharedPrefix(bench.SharedPrefixOptions{Prefixes: *prefixes, PrefixTokens: *prefixTok, SuffixTokens: *suffixTok,
				OutputTokens: *outputTok, Requests: *requests, Skew: *skew, Seed: seed}), nil
		case "multi-turn":
			return bench.MultiTurn(bench.MultiTurnOptions{Conversations: *convs, Turns: *turns, SystemTokens: *sysTok, UserTokens: *userTok,
				OutputTokens: *outputTok, Think: *think, Seed: seed}), nil
		case "lora":
			return bench.LoRA(bench.LoRAOptions{Adapters: *adapters, Skew: *adapterSkew, SystemTokens: *sysTok, UserTokens: *userTok,
				OutputTokens: *outputTok, Requests: *requests, Seed: seed}), nil
		case "pd":
			return pf.workload(*requests, seed)
		case "trace":
			return traceW, nil
		}
		return nil, fmt.Errorf("unknown --workload %q", *workload)
	}
	w, err := build(*seed)
	if err != nil {
		return err
	}
	parseArrs := func(seed uint64) ([]bench.Arrivals, error) {
		var arrs []bench.Arrivals
		if *sweep != "" {
			kind, list, ok := strings.Cut(*sweep, ":")
			if !ok {
				return nil, fmt.Errorf("--sweep %q: want KIND:V1,V2,...", *sweep)
			}
			for _, v := range strings.Split(list, ",") {
				a, err := bench.ParseArrivals(kind+":"+v, seed)
				if err != nil {
					return nil, err
				}
				arrs = append(arrs, a)
			}
			return arrs, nil
		}
		a, err := bench.ParseArrivals(*arrivals, seed)
		if err != nil {
			return nil, err
		}
		return append(arrs, a), nil
	}
	arrs, err := parseArrs(*seed)
	if err != nil {
		return err
	}
	if *qos != "" {
		if len(targets) > 0 {
			return errors.New("--qos runs virtual only")
		}
		p := "kvroute"
		if *policies != "all" {
			p = *policies
		}
		rows, err := bench.RunQoS(*qos, arrs[0].Apply(w), bench.VirtualOptions{Workers: *nworkers, Profile: prof, Policy: p, Arrivals: arrs[0],
			Seed: *seed, EventLag: *lag, Speeds: speeds, Slowdowns: slows, KnownSpeeds: *knownSpeeds, CacheTurnover: *cacheTurnover, UtilizationBacklog: *utilBacklog, KVWait: *kvWait}, *qosShare, *qosObjective, *qosMaxQueue)
		if err != nil {
			return err
		}
		fmt.Print(bench.QoSTable(rows))
		return nil
	}
	if (len(speeds) > 0 || len(slows) > 0) && len(targets) > 0 {
		return errors.New("--worker-speeds and --slow apply to virtual runs only")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bar := bench.NewProgress(os.Stderr, *progress)
	rep := &bench.Report{Workload: w.Name, Params: map[string]string{"seed": strconv.FormatUint(*seed, 10), "slo": slo.String(), "args": strings.Join(args, " ")}}
	var points []bench.LoadPoint
	var groups [][]bench.Summary
	var extra []bench.Summary // seeds after the first
	if len(targets) == 0 {
		rep.Target = "virtual"
		rep.Params["profile"], rep.Params["workers"] = prof.Name, strconv.Itoa(*nworkers)
		names := bench.PolicyNames()
		if *workload == "lora" {
			names = bench.LoRAPolicies
		}
		if *workload == "pd" {
			names = bench.PDPolicies
		}
		if *policies != "all" {
			names = strings.Split(*policies, ",")
		}
		runs, err := virtualRuns(names, *admMode, *flowControl, *slo, *highShare, *highAtt)
		if err != nil {
			return err
		}
		if len(speeds) > 0 || len(slows) > 0 {
			rep.Params["worker_speeds"], rep.Params["slow"] = *speedsFlag, slowFlags.String()
			rep.Params["known_speeds"] = strconv.FormatBool(*knownSpeeds)
		}
		for k := 0; k < *nseeds; k++ {
			sd := *seed + uint64(k)
			sw, sarrs := w, arrs
			if k > 0 {
				if sw, err = build(sd); err != nil {
					return err
				}
				if sarrs, err = parseArrs(sd); err != nil {
					return err
				}
			}
			for _, a := range sarrs {
				wl := a.Apply(sw)
				if flash != nil {
					wl = flash.Apply(wl)
				}
				bound := bench.HitBound(wl, prof.BlockSize)
				pooled := bench.HitBoundLRU(wl, prof.BlockSize, *nworkers*prof.NumBlocks)
				var g []bench.Summary
				for _, run := range runs {
					p := run.policy
					bar.Start(fmt.Sprintf("%s %s seed %d", a, run.label, sd))
					rs, err := bench.RunVirtual(wl, bench.VirtualOptions{Workers: *nworkers, Profile: prof, Policy: p, Arrivals: a, Seed: sd,
						EventLag: *lag, Progress: bar.Update, Speeds: speeds, Slowdowns: slows, KnownSpeeds: *knownSpeeds, CacheTurnover: *cacheTurnover, UtilizationBacklog: *utilBacklog, KVWait: *kvWait,
						Replicas: *nreplicas, Share: !*blind, ExchangeDelay: *exDelay, ExchangeInterval: *exInterval,
						ExchangeSync: *exSync, PeerState: *peerState, Admission: run.cls, High: run.high, HighShare: *highShare, Roles: roles})
					if err != nil {
						return err
					}
					label := run.label
					if *nreplicas > 1 {
						label = fmt.Sprintf("%s×%d %s", p, *nreplicas, map[bool]string{false: "shared", true: "blind"}[*blind])
					}
					s := bench.Summarize(label, a.String(), rs, *slo, bound, bench.WorkerNames(*nworkers))
					fmt.Printf("%s %s seed %d: prefill tokens beyond one infinite cache (duplicate cold prefills and evictions): %d\n",
						label, a, sd, bench.ExtraPrefillTokens(rs, bound))
					s.HitPooled = pooled
					if flash != nil {
						s.Flash = bench.Flash(rs, *slo, *flash, 10*time.Second)
						fmt.Printf("%s %s seed %d: flash crowd %s: SLO attainment before %.3f, recovered %.0f s after the burst\n", label, a, sd, flash, s.Flash.Before, s.Flash.RecoveryS)
					}
					for _, c := range slices.Sorted(maps.Keys(s.Classes)) {
						cm := s.Classes[c]
						fmt.Printf("%s %s seed %d: class %s: %d requests, %d refused, SLO met %.3f\n", label, a, sd, c, cm.Requests, cm.Refused, cm.SLOMet)
					}
					if *nseeds > 1 {
						s.Seed = sd
					}
					g = append(g, s)
					if k == 0 {
						points = append(points, bench.LoadPoint{Load: a.Rate, S: s})
					}
				}
				if k == 0 {
					groups = append(groups, g)
				} else {
					extra = append(extra, g...)
				}
			}
		}
	} else {
		rep.Target = "http"
		var ts []bench.HTTPTarget
		for _, s := range targets {
			t, err := bench.ParseTarget(s)
			if err != nil {
				return err
			}
			ts = append(ts, t)
		}
		var wm []string
		if *workerMetrics != "" {
			wm = strings.Split(*workerMetrics, ",")
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
		for _, a := range arrs {
			wl := a.Apply(w)
			bound := bench.HitBound(wl, prof.BlockSize)
			var g []bench.Summary
			for _, t := range ts {
				if *resetURLs != "" {
					if err := resetCaches(ctx, client, strings.Split(*resetURLs, ",")); err != nil {
						return err
					}
				}
				before := scrape(ctx, client, wm)
				bar.Start(fmt.Sprintf("%s %s", a, t.Name))
				rs := bench.RunHTTP(ctx, wl, t, bench.HTTPOptions{Arrivals: a, Model: *model, API: *api, Client: client, Seed: *seed, Progress: bar.Update})
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s := bench.Summarize(t.Name, a.String(), rs, *slo, bound, t.URLs)
				if t.Route == "" {
					s.PerWorker = nil
					s.LoadCV = 0
					if len(wm) > 0 {
						after := scrape(ctx, client, wm)
						s.PerWorker = map[string]int{}
						for i, u := range wm {
							s.PerWorker[u] = int(after[i] - before[i])
						}
						s.LoadCV = bench.CV(s.PerWorker)
					}
				}
				g = append(g, s)
				points = append(points, bench.LoadPoint{Load: a.Rate, S: s})
			}
			groups = append(groups, g)
		}
	}
	for _, g := range groups {
		rep.Summaries = append(rep.Summaries, g...)
	}
	fmt.Printf("workload %s (%d requests), target %s, SLO TTFT ≤ %s\n", w.Name, len(w.Items), rep.Target, slo)
	if *nseeds > 1 {
		fmt.Printf("seed %d:\n", *seed)
	}
	rep.WriteTable(os.Stdout)
	if *nseeds > 1 {
		rep.Summaries = append(rep.Summaries, extra...)
		rep.Seeds = bench.AggregateBySeeds(rep.Summaries)
		fmt.Printf("\nmean ± sd over seeds %d..%d:\n", *seed, *seed+uint64(*nseeds)-1)
		bench.WriteSeedTable(os.Stdout, rep.Seeds)
	}
	if err := rep.WriteJSON(filepath.Join(*out, "report.json"), *keep); err != nil {
		return err
	}
	var files []string
	for _, g := range groups {
		name := "ttft_cdf_" + strings.NewReplacer(":", "_", ".", "p").Replace(g[0].Arrivals) + ".svg"
		if err := writeSVG(filepath.Join(*out, name), func(f *os.File) {
			bench.WriteCDF(f, fmt.Sprintf("TTFT CDF, %s, %s", w.Name, g[0].Arrivals), g)
		}); err != nil {
			return err
		}
		files = append(files, name)
	}
	if len(arrs) > 1 && arrs[0].Rate > 0 {
		if err := writeSVG(filepath.Join(*out, "ttft_vs_load.svg"), func(f *os.File) {
			bench.WriteTTFTvsLoad(f, fmt.Sprintf("p90 TTFT vs offered load, %s", w.Name), points)
		}); err != nil {
			return err
		}
		files = append(files, "ttft_vs_load.svg")
	}
	fmt.Printf("report: %s; plots: %s\n", filepath.Join(*out, "report.json"), strings.Join(prefixAll(*out, files), " "))
	return nil
}

func prefixAll(dir string, fs []string) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = filepath.Join(dir, f)
	}
	return out
}

func writeSVG(path string, f func(*os.File)) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	f(fh)
	return fh.Close()
}

func scrape(ctx context.Context, c *http.Client, urls []string) []float64 {
	out := make([]float64, len(urls))
	for i, u := range urls {
		out[i], _ = bench.ScrapeCounter(ctx, c, u, "vllm:request_success_total")
	}
	return out
}

// resetCaches empties every worker's prefix cache (vLLM POST /reset_prefix_cache),
// retrying while the worker still finishes requests of the previous target.
func resetCaches(ctx context.Context, c *http.Client, urls []string) error {
	for _, u := range urls {
		var last string
		ok := false
		for try := 0; try < 50 && !ok; try++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(u, "/")+"/reset_prefix_cache", nil)
			resp, err := c.Do(req)
			if err != nil {
				last = err.Error()
			} else {
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
				last = resp.Status
			}
			if !ok {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
		if !ok {
			return fmt.Errorf("reset prefix cache of %s: %s", u, last)
		}
	}
	return nil
}

type scoreboardArgs struct {
	trace             string
	seeds, traceSeeds int
	rows              string
	parallel          int
	policies          string
	lag               time.Duration
	cacheTurnover     bool
	utilBacklog       bool
	kvWait            bool
	out, doc          string
	args              []string
}

// runScoreboard runs bench.ScoreboardRows, prints the scoreboard, writes it to
// OUT/scoreboard.md and OUT/scoreboard.json, and splices it into the --doc file.
func runScoreboard(a scoreboardArgs) error {
	if a.trace == "" {
		a.trace = bench.DefaultTracePath
	}
	rows, err := bench.FilterRows(bench.ScoreboardRows(bench.ScoreboardOptions{TracePath: a.trace, Seeds: a.seeds, TraceSeeds: a.traceSeeds}), a.rows)
	if err != nil {
		return err
	}
	var pols []string
	if a.policies != "all" {
		pols = strings.Split(a.policies, ",")
	}
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		return err
	}
	start := time.Now()
	res, err := bench.RunScoreboard(rows, bench.ScoreboardRun{Policies: pols, Parallel: a.parallel, EventLag: a.lag, CacheTurnover: a.cacheTurnover, UtilizationBacklog: a.utilBacklog, KVWait: a.kvWait, Log: os.Stderr})
	if err != nil {
		return err
	}
	cmd := "kvbench " + strings.Join(a.args, " ")
	var md strings.Builder
	bench.WriteScoreboard(&md, res, time.Since(start), cmd)
	fmt.Print(md.String())
	for i := range res {
		fmt.Printf("\n== %s (%s)\n", res[i].Name, res[i].Key)
		bench.WriteSeedTable(os.Stdout, res[i].Agg)
	}
	if err := os.WriteFile(filepath.Join(a.out, "scoreboard.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(a.out, "scoreboard.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if a.doc != "" {
		old, err := os.ReadFile(a.doc)
		if err != nil {
			return err
		}
		upd, err := bench.SpliceSection(old, []byte(md.String()), bench.ScoreboardBegin, bench.ScoreboardEnd)
		if err != nil {
			return fmt.Errorf("%s: %w", a.doc, err)
		}
		if err := os.WriteFile(a.doc, upd, 0o644); err != nil {
			return err
		}
		fmt.Printf("\nscoreboard written into %s\n", a.doc)
	}
	return nil
}
