// Package app assembles kvroute from a Config: the worker registry, the KV index, the
// tokenizer, the scoring policy, the router core, and the servers around them. The
// binary (cmd/kvroute) and the end-to-end tests both build kvroute through it, so
// every dependency is constructed explicitly here, never registered from init().
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/kvindex/zmqsub"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tracing"
	"github.com/kvroute/kvroute/workers"
)

// App is one assembled kvroute.
type App struct {
	Config   *config.Config
	Logger   *slog.Logger
	Registry *workers.Registry
	Index    *kvindex.Index
	KVEvents *zmqsub.Manager // KV event subscriptions feeding Index
	Router   *router.Router
	Tokenize *tokenize.Service
	Metrics  *metrics.Set
	Gatherer prometheus.Gatherer
	Tracing  *tracing.Provider // kvroute.route spans; flushed when Run returns
	// Peers exchanges bookings with peer replicas (nil: peers.listen_addr unset);
	// PeerRegistry holds the peer addresses it streams to.
	Peers        *peers.Manager
	PeerRegistry *workers.Registry
	// Admission is the admission stage both fronts run (tenant identity, budgets).
	Admission *admission.Admitter
	// Classify is the classify stage; nil when classify.rules is empty (off).
	Classify *classify.Rules
	// classifyModel reloads classify.model into Classify (nil: no model or no rules).
	classifyModel *classify.ModelWatcher

	ready       chan struct{}
	explainSem  chan struct{} // bounds concurrent /debug/explain (server.admin_explain_concurrency)
	indexSynced atomic.Bool   // the index was in exact mode for some worker once (readiness)
}

// New builds an App from cfg. Nothing listens or runs until Serve/Proxy is called.
func New(cfg *config.Config, logger *slog.Logger) (*App, error) {
	if logger == nil {
		logger = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ms := metrics.New(reg)
	a := &App{Config: cfg, Logger: logger, Registry: workers.NewRegistry(), Metrics: ms, Gatherer: reg, ready: make(chan struct{}),
		explainSem: make(chan struct{}, max(1, cfg.Server.AdminExplainConcurrency))}
	// KV index and events: the index keyed per model namespace, and the subscriber
	// manager that follows the registry (workers added/removed start/stop their
	// subscriptions and release their entries).
	var idxModels []kvindex.Model
	for _, m := range cfg.Models {
		idxModels = append(idxModels, kvindex.Model{Name: m.Name, Base: m.Base, BlockSize: m.BlockSize})
	}
	a.Index = kvindex.New(kvindex.Options{SpeculativeTTL: cfg.Index.SpeculativeTTL, MaxBytes: cfg.Index.MaxBytes,
		Models: idxModels, DefaultBlockSize: cfg.Router.DefaultBlockSize, SpecKinds: cfg.Index.SpecKinds,
		Metrics: ms.Index, Logger: logger})
	kvev, err := zmqsub.New(zmqsub.Options{Index: a.Index, Metrics: ms.Index, Logger: logger, QueueSize: cfg.Index.QueueSize,
		ReplayTimeout: cfg.Index.ReplayTimeout, ReconnectMin: cfg.Index.ReconnectMin, ReconnectMax: cfg.Index.ReconnectMax,
		BindEndpoint: cfg.Index.BindEndpoint, TopicPattern: cfg.Index.TopicPattern, SweepEvery: cfg.Index.SweepInterval,
		MaxMessageBytes: cfg.Index.MaxMessageBytes, ReplayBackoffMin: cfg.Index.ReplayBackoffMin, ReplayBackoffMax: cfg.Index.ReplayBackoffMax,
		ReplayBufferFrames: cfg.Index.ReplayBufferFrames, ReplayBufferBytes: cfg.Index.ReplayBufferBytes,
		SilentAfter: silentAfter(cfg.Index.SilentAfter)})
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	a.KVEvents = kvev
	a.Registry.Subscribe(a.KVEvents)
	tc := cfg.Tracing
	a.Tracing, err = tracing.New(context.Background(), tracing.Options{Enabled: tc.Enabled, Protocol: tc.Protocol,
		Endpoint: tc.Endpoint, Insecure: tc.Insecure, SampleRatio: tc.SampleRatio, Version: Version})
	if err != nil {
		return nil, err
	}
	policy, err := newPolicy(cfg, ms, logger)
	if err != nil {
		return nil, err
	}
	var models []router.Model
	for _, m := range cfg.Models {
		models = append(models, router.Model{Name: m.Name, BlockSize: m.BlockSize, Base: m.Base, MaxModelLen: m.MaxModelLen,
			KVBytesPerToken: m.KVBytes()})
	}
	// Tokenization: per-model path chains (local tokenizer, then a worker's /tokenize),
	// remote calls spread round robin over the model's healthy workers.
	var tms []tokenize.ModelConfig
	for _, m := range cfg.Models {
		mc := tokenize.ModelConfig{Name: m.Name, Tokenizer: m.Tokenizer, Base: m.Base, RemoteTimeout: m.RemoteTokenizeTimeout,
			RemoteBudget: m.RemoteTokenizeBudget}
		for _, p := range m.TokenizePaths {
			mc.Paths = append(mc.Paths, tokenize.Path(p))
		}
		tms = append(tms, mc)
	}
	var tokRR atomic.Uint64
	harmonyLoc := time.UTC
	if cfg.Tokenize.HarmonyTimeZone != "" {
		if harmonyLoc, err = time.LoadLocation(cfg.Tokenize.HarmonyTimeZone); err != nil {
			return nil, fmt.Errorf("tokenize.harmony_time_zone: %w", err)
		}
	}
	a.Tokenize, err = tokenize.NewService(tokenize.ServiceOptions{Models: tms, Metrics: ms.Tokenize, Logger: logger,
		Load: tokenize.Options{CacheBytes: cfg.Tokenize.CacheBytes, MinCachedSegment: cfg.Tokenize.MinCachedSegment, RenderCacheBytes: cfg.Tokenize.RenderCacheBytes,
			Harmony: tokenize.HarmonyOptions{Location: harmonyLoc, StartDate: cfg.Tokenize.HarmonyStartDate}},
		Shadow: tokenize.ShadowOptions{Fraction: cfg.Tokenize.Shadow.Fraction, MaxPerSecond: cfg.Tokenize.Shadow.MaxPerSecond,
			MismatchRate: cfg.Tokenize.Shadow.MismatchRate, MinChecks: cfg.Tokenize.Shadow.MinChecks, Timeout: cfg.Tokenize.Shadow.Timeout},
		Addresses: func(model string) []string {
			ws, _ := a.Registry.Candidates(model, nil)
			if len(ws) == 0 {
				return nil
			}
			// Round robin: start at the next worker, then the others in turn (a
			// worker that fails is followed by another).
			start := int(tokRR.Add(1) % uint64(len(ws)))
			out := make([]string, len(ws))
			for i := range ws {
				out[i] = ws[(start+i)%len(ws)].Address
			}
			return out
		}})
	if err != nil {
		return nil, err
	}
	a.Router = router.New(router.Options{Registry: a.Registry, Index: a.Index, Policy: policy, Models: models,
		DefaultBlockSize: cfg.Router.DefaultBlockSize, TicketTTL: cfg.Router.TicketTTL, Metrics: ms, Tokenizer: a.Tokenize,
		MaxPromptTokens: cfg.Router.MaxPromptTokens, Tracer: a.Tracing.Tracer(),
		Saturation: router.Saturation{BatchTokens: cfg.Scoring.BatchTokens}})
	if l, ok := policy.(workers.Listener); ok { // scoring: forget removed workers' models
		a.Registry.Subscribe(l)
	}
	a.Registry.Set(staticWorkers(cfg))
	if err := a.newPeers(); err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	if a.Admission, err = admission.New(admission.Options{Config: cfg.Admission, Metrics: ms}); err != nil {
		return nil, err
	}
	a.Router.OnCapacity(a.Admission.Wake) // the queue dispatches when capacity frees
	if a.Classify, a.classifyModel, err = newClassify(cfg, ms, logger); err != nil {
		return nil, err
	}
	return a, nil
}

// newClassify loads classify.model (with the watcher that reloads it), makes the
// classify.remote client and compiles classify.rules (all nil with no rules: the stage
// is off). A missing or unreadable
// model, or an invalid rule, fails start-up; the remote is not called until a request
// needs it.
func newClassify(cfg *config.Config, ms *metrics.Set, logger *slog.Logger) (*classify.Rules, *classify.ModelWatcher, error) {
	if len(cfg.Classify.Rules) == 0 {
		return nil, nil, nil
	}
	var model *classify.Linear
	var watch *classify.ModelWatcher
	if cfg.Classify.Model != "" {
		m, w, err := classify.LoadWatched(cfg.Classify.Model, ms.Classify, logger)
		if err != nil {
			return nil, nil, fmt.Errorf("classify.model: %w", err)
		}
		model, watch = m, w
	}
	var remote *classify.Remote
	if rc := cfg.Classify.Remote; rc.URL != "" {
		cache := rc.CacheSize
		if cache == 0 {
			cache = -1 // none
		}
		r, err := classify.NewRemote(classify.RemoteOptions{URL: rc.URL, Model: rc.Model, Timeout: rc.Timeout,
			MaxConcurrent: rc.MaxConcurrency, CacheEntries: cache, MaxInputBytes: rc.MaxInputBytes})
		if err != nil {
			return nil, nil, fmt.Errorf("classify.remote: %w", err)
		}
		r.Count(ms.Classify)
		remote = r
	}
	var classes []string
	for _, c := range cfg.Admission.Classes {
		classes = append(classes, c.Name)
	}
	rs, err := classify.CompileWith(cfg.Classify.Rules, classify.Classifiers{Model: model, Remote: remote}, classes)
	if err != nil {
		return nil, nil, err
	}
	rs.Count(ms.Classify)
	if watch != nil {
		watch.Watch(rs)
	}
	return rs, watch, nil
}

func newPolicy(cfg *config.Config, ms *metrics.Set, logger *slog.Logger) (scoring.Policy, error) {
	o := cfg.Scoring.Options()
	o.Metrics = ms.Scoring
	o.Logger = logger
	return scoring.New(cfg.Scoring.Policy, o)
}

// staticWorkers converts the configured workers; a worker without models serves every
// configured model (or any model when none are configured).
func staticWorkers(cfg *config.Config) []*workers.Worker {
	var all []string
	for _, m := range cfg.Models {
		all = append(all, m.Name)
	}
	out := make([]*workers.Worker, 0, len(cfg.Workers))
	for _, w := range cfg.Workers {
		name := w.Name
		if name == "" {
			name = w.Address
		}
		models := w.Models
		if len(models) == 0 {
			models = all
		}
		role, _ := workers.ParseRole(w.Role) // validated by config.Validate
		out = append(out, &workers.Worker{Name: name, Address: w.Address, Models: models, Role: role,
			KVEvents: workers.KVEvents{Endpoint: w.KVEvents.Endpoint, ReplayEndpoint: w.KVEvents.ReplayEndpoint, Topic: w.KVEvents.Topic, DPSize: w.KVEvents.DPSize},
			Profile:  workerProfile(w.Profile)})
	}
	return out
}

// workerProfile converts a configured profile (workers[].profile, discovery.profile).
func workerProfile(p config.WorkerProfile) workers.Profile {
	return workers.Profile{PrefillTokensPerSecond: p.PrefillTokensPerSecond, DecodeTokensPerSecond: p.DecodeTokensPerSecond,
		Overhead: p.Overhead, BlockCapacity: p.BlockCapacity, MaxNumSeqs: p.MaxNumSeqs}
}

// Listeners are the sockets an App serves on. Tests pass ephemeral ones.
type Listeners struct {
	ExtProc net.Listener // required for Serve
	Health  net.Listener // optional: a separate gRPC health listener
	Admin   net.Listener // optional
	Proxy   net.Listener // required for Proxy
	Peers   net.Listener // peer replicas' streams; required when peers.listen_addr is set
}

// Listen opens the listeners named in the config: ext_proc+health+admin for serve,
// proxy+admin for proxy.
func Listen(cfg *config.Config, proxyMode bool) (Listeners, error) {
	var l Listeners
	var err error
	open := func(addr string) net.Listener {
		if err != nil || addr == "" {
			return nil
		}
		var ln net.Listener
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("listen %s: %w", addr, err)
		}
		return ln
	}
	if proxyMode {
		l.Proxy = open(cfg.Server.ProxyAddr)
	} else {
		l.ExtProc = open(cfg.Server.ExtProcAddr)
		if cfg.Server.HealthAddr != cfg.Server.ExtProcAddr {
			l.Health = open(cfg.Server.HealthAddr)
		}
	}
	l.Admin = open(cfg.Server.AdminAddr)
	l.Peers = open(cfg.Peers.ListenAddr)
	if err != nil {
		l.Close()
		return Listeners{}, err
	}
	return l, nil
}

// Close closes every open listener.
func (l Listeners) Close() {
	for _, ln := range []net.Listener{l.ExtProc, l.Health, l.Admin, l.Proxy, l.Peers} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Run serves until ctx is cancelled: the ext_proc gRPC server (with gRPC health) when
// l.ExtProc is set, the proxy when l.Proxy is set, the admin HTTP server when l.Admin
// is set, plus the router's sweep. It returns after a graceful shutdown.
func (a *App) Run(ctx context.Context, l Listeners) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer a.Admission.Close() // the redis budget backend's connections (nil-safe)
	var wg sync.WaitGroup
	errc := make(chan error, 16) // ≥ the number of goRun calls below: a failing server never blocks
	goRun := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	goRun(func() error { a.Router.Run(ctx); return nil })
	if a.classifyModel != nil && a.Config.Classify.ReloadInterval > 0 {
		goRun(func() error { a.classifyModel.Run(ctx, a.Config.Classify.ReloadInterval); return nil })
	}
	goRun(func() error { return a.KVEvents.Run(ctx) })
	// Worker discovery (discovery.mode ≠ static): the source keeps the registry equal to
	// static ∪ discovered; the router, index and subscriptions follow its listeners.
	if src, err := a.newDiscovery(); err != nil {
		cancel()
		wg.Wait()
		return err
	} else if src != nil {
		goRun(func() error { return src.Run(ctx) })
		a.Logger.Info("worker discovery started", "mode", a.Config.Discovery.Mode)
	}
	// peers: stream this replica's bookings to its peers and apply theirs.
	if a.Peers != nil {
		if l.Peers == nil {
			cancel()
			wg.Wait()
			return errors.New("peers: peers.listen_addr is set but Listeners.Peers is nil")
		}
		src, err := a.newPeerDiscovery()
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("peers discovery: %w", err)
		}
		if src != nil {
			goRun(func() error { return src.Run(ctx) })
		}
		goRun(func() error { return a.Peers.Run(ctx, l.Peers) })
		a.Logger.Info("peers listening", "addr", l.Peers.Addr().String(), "id", a.Peers.ID())
	}
	// scoring: poll each worker's vLLM /metrics (load for the predictor, health).
	if sc := a.Config.Scoring.Scrape; sc.Interval > 0 {
		scraper := workers.NewScraper(a.Registry, workers.ScrapeOptions{Interval: sc.Interval, Timeout: sc.Timeout,
			FailuresBeforeUnhealthy: sc.FailuresBeforeUnhealthy, Metrics: a.Metrics.Scoring, Logger: a.Logger,
			OnRestart: a.KVEvents.WorkerRestarted}) // a restarted worker's stale index goes before it is healthy again
		goRun(func() error { scraper.Run(ctx); return nil })
	}

	var grpcServers []*grpc.Server
	var httpServers []*http.Server
	hs := health.NewServer()
	if l.ExtProc != nil {
		// Envoy's side-stream connection may send HTTP/2 keepalive pings
		// (connection_keepalive); grpc-go's default enforcement (5 min) answers frequent
		// pings with GOAWAY too_many_pings, killing every in-flight ext_proc stream.
		gopts, err := a.extProcServerOptions()
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		srv := grpc.NewServer(append(gopts, grpc.MaxRecvMsgSize(a.Config.Server.GRPCMaxRecvBytes),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))...)
		extprocv3.RegisterExternalProcessorServer(srv, extproc.New(extproc.Options{Router: a.Router, Config: a.Config.ExtProc, Metrics: a.Metrics, Logger: a.Logger, Tracer: a.Tracing.Tracer(), Admission: a.Admission, Classify: a.Classify}))
		healthpb.RegisterHealthServer(srv, hs)
		grpcServers = append(grpcServers, srv)
		goRun(func() error { return serveGRPC(srv, l.ExtProc) })
		a.Logger.Info("ext_proc listening", "addr", l.ExtProc.Addr().String())
	}
	if l.Health != nil {
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, hs)
		grpcServers = append(grpcServers, srv)
		goRun(func() error { return serveGRPC(srv, l.Health) })
		a.Logger.Info("grpc health listening", "addr", l.Health.Addr().String())
	}
	if l.Proxy != nil {
		srv := a.httpServer(proxy.New(proxy.Options{Router: a.Router, Config: a.Config.ExtProc, Metrics: a.Metrics, Logger: a.Logger,
			NoPassiveHealth: a.Config.Scoring.Scrape.Interval <= 0, Proxy: a.Config.Proxy, Tracer: a.Tracing.Tracer(),
			BodyTimeout: a.Config.Server.HTTPBodyTimeout, WriteTimeout: a.Config.Server.HTTPWriteTimeout, Admission: a.Admission, Classify: a.Classify}), false)
		httpServers = append(httpServers, srv)
		goRun(func() error { return serveHTTP(srv, l.Proxy) })
		a.Logger.Info("proxy listening", "addr", l.Proxy.Addr().String())
	}
	if l.Admin != nil {
		srv := a.httpServer(a.AdminHandler(), true)
		httpServers = append(httpServers, srv)
		goRun(func() error { return serveHTTP(srv, l.Admin) })
		a.Logger.Info("admin listening", "addr", l.Admin.Addr().String())
	}
	close(a.ready)
	a.updateHealth(hs)
	goRun(func() error { a.serveHealth(ctx, hs); return nil })
	<-ctx.Done()
	hs.Shutdown()
	grace, gcancel := context.WithTimeout(context.Background(), a.Config.Server.ShutdownGrace)
	defer gcancel()
	for _, s := range httpServers {
		_ = s.Shutdown(grace)
	}
	for _, s := range grpcServers {
		done := make(chan struct{})
		go func() { s.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-grace.Done():
			s.Stop()
		}
	}
	wg.Wait()
	if err := a.Tracing.Shutdown(grace); err != nil {
		a.Logger.Warn("tracing: flushing spans at shutdown", "err", err)
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// Ready is closed once Run has started every server.
func (a *App) Ready() <-chan struct{} { return a.ready }

func serveGRPC(s *grpc.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func serveHTTP(s *http.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// silentAfter maps index.silent_after (0: no warning) to zmqsub.Options.SilentAfter
// (0: the default, negative: no warning).
func silentAfter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
