package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/bench"
)

// loadFlags are kvbench --load's: a concurrency × body size sweep of streaming chat
// requests, straight to the workers (the --http target named "direct") and through
// each other --http target, reporting the added TTFT and the router's CPU per request.
type loadFlags struct {
	on          *bool
	concurrency *string
	bodies      *string
	requests    *int
	distinct    *int
	shape       *string
	pids        *string
	metrics     *string
}

func addLoadFlags(fs *flag.FlagSet) loadFlags {
	return loadFlags{
		on:          fs.Bool("load", false, "load sweep: --http direct=round_robin:WORKER_URLS plus one or more router targets; reports TTFT added by each router vs direct in the same run"),
		concurrency: fs.String("concurrency", "1,50,200", "--load: closed-loop clients per point"),
		bodies:      fs.String("body-sizes", "4k,220k", "--load: chat body sizes (k = KiB, m = MiB)"),
		requests:    fs.Int("load-requests", 400, "--load: requests per target and point (at least 2 × concurrency)"),
		distinct:    fs.Int("distinct-bodies", 16, "--load: distinct bodies per size, cycled (next-turn: at least one conversation per client)"),
		shape:       fs.String("load-shape", "repeat", "--load: repeat (the distinct bodies cycled) or next-turn (each request is its conversation's previous one plus an answer and a new ~1 KB user message, as an agent's next call)"),
		pids:        fs.String("router-pid", "", "--load: comma-separated PIDs of the router targets' processes (in --http order) for CPU per request from /proc"),
		metrics:     fs.String("router-metrics", "", "--load: comma-separated /metrics URLs of the router targets (process_cpu_seconds_total), instead of --router-pid"),
	}
}

func parseSize(s string) (int, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	mul := 1
	switch {
	case strings.HasSuffix(s, "k"):
		mul, s = 1024, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mul, s = 1<<20, strings.TrimSuffix(s, "m")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mul, nil
}

func runLoad(lf loadFlags, targets []string, model, out string, seed uint64) error {
	o := bench.LoadOptions{Model: model, Requests: *lf.requests, Distinct: *lf.distinct, Seed: seed}
	switch *lf.shape {
	case "repeat":
	case "next-turn":
		o.NextTurn = true
	default:
		return fmt.Errorf("--load-shape: %q is neither repeat nor next-turn", *lf.shape)
	}
	for _, s := range targets {
		t, err := bench.ParseTarget(s)
		if err != nil {
			return err
		}
		if t.Name == "direct" {
			o.Direct = t
		} else {
			o.Routers = append(o.Routers, t)
		}
	}
	if len(o.Direct.URLs) == 0 || len(o.Routers) == 0 {
		return errors.New("--load needs --http direct=round_robin:WORKER_URLS and at least one router --http target")
	}
	for _, c := range strings.Split(*lf.concurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			return fmt.Errorf("--concurrency: bad value %q", c)
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	for _, s := range strings.Split(*lf.bodies, ",") {
		n, err := parseSize(s)
		if err != nil {
			return fmt.Errorf("--body-sizes: %w", err)
		}
		o.BodyBytes = append(o.BodyBytes, n)
	}
	client := &http.Client{}
	if *lf.pids != "" {
		for _, p := range strings.Split(*lf.pids, ",") {
			pid, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil {
				return fmt.Errorf("--router-pid: bad pid %q", p)
			}
			o.RouterCPU = append(o.RouterCPU, bench.ProcCPU(pid))
		}
	} else if *lf.metrics != "" {
		for _, u := range strings.Split(*lf.metrics, ",") {
			o.RouterCPU = append(o.RouterCPU, bench.MetricsCPU(client, strings.TrimSpace(u)))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pts := bench.RunLoad(ctx, o)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fmt.Print(bench.FormatLoad(pts))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(pts, "", "  ")
	path := filepath.Join(out, "load.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	fmt.Println("report:", path)
	return nil
}
