package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/metrics"
)

// Scrape errors, one per failure class (counted by reason).
var (
	ErrScrapeHTTP    = errors.New("workers: scrape request failed")
	ErrScrapeTimeout = errors.New("workers: scrape timed out")
	ErrScrapeStatus  = errors.New("workers: scrape returned a non-200 status")
	ErrScrapeParse   = errors.New("workers: scrape body is not Prometheus text")
	ErrNoVLLMSeries  = errors.New("workers: no vllm load metric in the scrape")
)

// vLLM metric names read by the scraper (vllm/v1/metrics/loggers.py). The KV usage
// gauge was renamed in vLLM 0.10 from vllm:gpu_cache_usage_perc; both are accepted.
const (
	metricWaiting     = "vllm:num_requests_waiting"
	metricRunning     = "vllm:num_requests_running"
	metricKVUsage     = "vllm:kv_cache_usage_perc"
	metricKVUsageOld  = "vllm:gpu_cache_usage_perc"
	metricStart       = "process_start_time_seconds"
	maxScrapeBodySize = 16 << 20
)

// ParseLoad reads a vLLM /metrics body in the Prometheus text format. Waiting and
// running requests are summed over every series (data-parallel engines, models);
// KV-cache usage (a 0..1 fraction per engine) is averaged; the LoRA state is the
// newest series of vllm:lora_requests_info (lora.go). ScrapedAt is left zero.
// It fails with ErrScrapeParse on malformed text and ErrNoVLLMSeries when none of
// these metrics is present (not a vLLM endpoint).
func ParseLoad(r io.Reader) (Load, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Load{}, fmt.Errorf("%w: %v", ErrScrapeParse, err)
	}
	var l Load
	found := false
	sum := func(name string) (float64, int) {
		f := fams[name]
		if f == nil {
			return 0, 0
		}
		s := 0.0
		for _, m := range f.GetMetric() {
			s += value(m)
		}
		return s, len(f.GetMetric())
	}
	if v, n := sum(metricWaiting); n > 0 {
		l.Waiting, found = v, true
	}
	if v, n := sum(metricRunning); n > 0 {
		l.Running, found = v, true
	}
	v, n := sum(metricKVUsage)
	if n == 0 {
		v, n = sum(metricKVUsageOld)
	}
	if n > 0 {
		l.KVUsage, found = v/float64(n), true
	}
	if f := fams[metricLoRA]; f != nil {
		if a, ok := parseAdapters(f); ok {
			l.Adapters, found = a, true
		}
	}
	if !found {
		return Load{}, ErrNoVLLMSeries
	}
	if f := fams[metricStart]; f != nil && len(f.GetMetric()) > 0 {
		l.ProcessStart = value(f.GetMetric()[0])
	}
	return l, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// Scrape defaults for zero ScrapeOptions fields (config.Default takes them from here).
const (
	DefaultScrapeInterval          = time.Second
	DefaultFailuresBeforeUnhealthy = 3
)

// ScrapeOptions configures a Scraper. Zero values take the documented defaults.
type ScrapeOptions struct {
	Interval time.Duration // between rounds; 0 → 1 s
	Timeout  time.Duration // per scrape; 0 → Interval (at most 5 s)
	// FailuresBeforeUnhealthy consecutive failed scrapes mark a worker unhealthy (the
	// router stops picking it); one success marks it healthy again. 0 → 3.
	FailuresBeforeUnhealthy int
	Client                  *http.Client     // nil → a client with Timeout
	Now                     func() time.Time // nil → time.Now (stamps Load.ScrapedAt)
	Metrics                 *metrics.Scoring // nil → none
	Logger                  *slog.Logger     // nil → slog.Default()
	// OnRestart, when set, is called with a worker's name when its process_start_time_seconds
	// changed between two successful scrapes (the worker restarted: its KV cache is
	// empty), before the scrape's load and health are recorded.
	OnRestart func(worker string)
	// Lag reports the largest delay kvroute's own goroutines saw between being due and
	// running during [from, to] (times from Now). A scrape that timed out while
	// max(Lag, its own overshoot of Timeout) ≥ StarvedLag is inconclusive: kvroute was
	// too starved of CPU to do its side of the exchange in time, so the timeout says
	// nothing about the worker; it is counted (reason "starved") but neither adds to nor
	// resets the worker's consecutive failures. Refusals, resets, bad statuses and bodies
	// always count. nil → a LagMonitor heartbeat that Run starts (ScrapeOnce alone then
	// sees only the overshoot).
	Lag func(from, to time.Time) time.Duration
	// StarvedLag is the scheduling delay from which a timeout is inconclusive; 0 →
	// Timeout/10 (100 ms at the 1 s default: an idle Go process wakes within a
	// millisecond or two; a scrape needs several wake-ups, each delayed as much).
	StarvedLag time.Duration
}

// Scraper polls every registered worker's vLLM GET http://<address>/metrics and
// records the load in the Registry (SetLoad with ScrapedAt) and health (SetHealthy).
type Scraper struct {
	reg *Registry
	o   ScrapeOptions

	mu     sync.Mutex         // guards fails, starts
	fails  map[string]int     // worker → consecutive failures
	starts map[string]float64 // worker → last process_start_time_seconds seen
	lagMon *LagMonitor        // the default Lag (nil when ScrapeOptions.Lag is set)
}

// DefaultScrapeTimeout is the timeout of one scrape when ScrapeOptions.Timeout is 0:
// the interval, at most 5 s.
func DefaultScrapeTimeout(interval time.Duration) time.Duration { return min(interval, 5*time.Second) }

// NewScraper returns a scraper over reg; nothing runs until Run or ScrapeOnce.
func NewScraper(reg *Registry, o ScrapeOptions) *Scraper {
	if o.Interval <= 0 {
		o.Interval = DefaultScrapeInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultScrapeTimeout(o.Interval)
	}
	if o.FailuresBeforeUnhealthy <= 0 {
		o.FailuresBeforeUnhealthy = DefaultFailuresBeforeUnhealthy
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Timeout}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StarvedLag <= 0 {
		o.StarvedLag = o.Timeout / 10
	}
	s := &Scraper{reg: reg, o: o, fails: map[string]int{}, starts: map[string]float64{}}
	if o.Lag == nil {
		s.lagMon = NewLagMonitor(0)
		s.lagMon.now = o.Now
		s.o.Lag = s.lagMon.Max
	}
	return s
}

// Run scrapes every Interval until ctx is cancelled, then returns (after the round in
// flight, whose requests are cancelled with ctx). The first round starts at once.
func (s *Scraper) Run(ctx context.Context) {
	if s.lagMon != nil {
		lagCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { s.lagMon.Run(lagCtx); close(done) }()
		defer func() { stop(); <-done }()
	}
	tk := time.NewTicker(s.o.Interval)
	defer tk.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

// ScrapeOnce scrapes every registered worker concurrently and waits for all of them.
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	ws := s.reg.All()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.scrapeWorker(ctx, w)
		}()
	}
	wg.Wait()
	s.mu.Lock()
	live := make(map[string]bool, len(ws))
	for _, w := range ws {
		live[w.Name] = true
	}
	for name := range s.fails {
		if !live[name] {
			delete(s.fails, name)
		}
	}
	for name := range s.starts {
		if !live[name] {
			delete(s.starts, name)
		}
	}
	s.mu.Unlock()
}

func (s *Scraper) scrapeWorker(ctx context.Context, w *Worker) {
	start, t0 := time.Now(), s.o.Now()
	l, err := s.fetch(ctx, w)
	if s.o.Metrics != nil {
		s.o.Metrics.ScrapeDuration.WithLabelValues(w.Name).Observe(time.Since(start).Seconds())
	}
	if ctx.Err() != nil {
		return // shutting down: not the worker's fault
	}
	if errors.Is(err, ErrScrapeTimeout) {
		t1 := s.o.Now()
		if lag := max(s.o.Lag(t0, t1), t1.Sub(t0)-s.o.Timeout); lag >= s.o.StarvedLag {
			if s.o.Metrics != nil {
				s.o.Metrics.ScrapeErrors.WithLabelValues(w.Name, "starved").Inc()
			}
			s.o.Logger.Debug("scrape timed out while kvroute itself was starved: not counted against the worker",
				"worker", w.Name, "lag", lag, "timeout", s.o.Timeout)
			return
		}
	}
	s.mu.Lock()
	if err != nil {
		s.fails[w.Name]++
	} else {
		s.fails[w.Name] = 0
	}
	n := s.fails[w.Name]
	s.mu.Unlock()
	if err != nil {
		reason := "http"
		switch {
		case errors.Is(err, ErrScrapeTimeout):
			reason = "timeout"
		case errors.Is(err, ErrScrapeStatus):
			reason = "status"
		case errors.Is(err, ErrScrapeParse), errors.Is(err, ErrNoVLLMSeries):
			reason = "parse"
		}
		if s.o.Metrics != nil {
			s.o.Metrics.ScrapeErrors.WithLabelValues(w.Name, reason).Inc()
		}
		s.o.Logger.Debug("scrape failed", "worker", w.Name, "err", err, "consecutive", n)
		if n == s.o.FailuresBeforeUnhealthy {
			s.o.Logger.Warn("worker marked unhealthy: /metrics scrapes failing", "worker", w.Name, "failures", n, "err", err)
			s.reg.SetHealthy(w.Name, false)
			if s.o.Metrics != nil {
				s.o.Metrics.ScrapeHealthy.WithLabelValues(w.Name).Set(0)
			}
		}
		return
	}
	if l.ProcessStart != 0 {
		s.mu.Lock()
		prev := s.starts[w.Name]
		s.starts[w.Name] = l.ProcessStart
		s.mu.Unlock()
		if prev != 0 && prev != l.ProcessStart && s.o.OnRestart != nil {
			s.o.Logger.Info("worker restarted (process start time changed)", "worker", w.Name)
			s.o.OnRestart(w.Name)
		}
	}
	l.ScrapedAt = s.o.Now()
	s.reg.SetLoad(w.Name, l)
	if !s.reg.Healthy(w.Name) {
		s.o.Logger.Info("worker healthy again", "worker", w.Name)
	}
	s.reg.SetHealthy(w.Name, true)
	if s.o.Metrics != nil {
		s.o.Metrics.ScrapeHealthy.WithLabelValues(w.Name).Set(1)
	}
}

// fetch scrapes w once within Timeout. Any failure after the deadline passed (dial,
// headers, or the body cut mid-read) is ErrScrapeTimeout.
func (s *Scraper) fetch(ctx context.Context, w *Worker) (Load, error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	l, err := s.fetchOnce(ctx, w)
	if err != nil && !errors.Is(err, ErrScrapeTimeout) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return Load{}, fmt.Errorf("%w after %s: %v", ErrScrapeTimeout, s.o.Timeout, err)
	}
	return l, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (s *Scraper) fetchOnce(ctx context.Context, w *Worker) (Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.Address+"/metrics", nil)
	if err != nil {
		return Load{}, fmt.Errorf("%w: %v", ErrScrapeHTTP, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.o.Client.Do(req)
	if err != nil {
		if isTimeout(err) {
			return Load{}, fmt.Errorf("%w after %s: %v", ErrScrapeTimeout, s.o.Timeout, err)
		}
		return Load{}, fmt.Errorf("%w: %v", ErrScrapeHTTP, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return Load{}, fmt.Errorf("%w: %s", ErrScrapeStatus, resp.Status)
	}
	return ParseLoad(io.LimitReader(resp.Body, maxScrapeBodySize))
}
