// Package zmqsub subscribes kvroute to vLLM workers' KV event streams over ZMQ and feeds
// the index: one SUB socket per worker and data-parallel rank (connect mode) or one
// bound SUB for all workers (bind mode), per-publisher sequence tracking, replay of
// gaps through the worker's ROUTER replay endpoint, restart detection, bounded
// per-worker queues. Socket behaviour follows vllm/distributed/kv_events.py
// (ZmqEventPublisher); see ../README.md.
//
// Ownership: every ZMQ socket is created, used and closed by exactly one goroutine
// (zmq sockets are not thread-safe). Receivers own SUB sockets; each worker's consumer
// owns its DEALER replay sockets and is the only writer of that worker's index state.
package zmqsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/workers"
)

// Options configures a Manager. Zero values take the documented defaults.
type Options struct {
	Index   *kvindex.Index // required
	Metrics *metrics.Index // nil: unregistered
	Logger  *slog.Logger   // nil: slog.Default()
	// QueueSize bounds each worker's queue of received, not yet applied messages. A
	// full queue drops the message (counted); the sequence gap then triggers a replay.
	// 0 means 4096.
	QueueSize int
	// ReplayTimeout bounds one replay exchange (request to end marker). 0 means 2s.
	ReplayTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between attempts to re-create a
	// failed socket (a socket error, or in connect mode a closed publisher connection),
	// and are set as ZMQ_RECONNECT_IVL / _MAX. The wait doubles per consecutive socket
	// that ended unhealthy and goes back to ReconnectMin after a healthy one: one that
	// received a well-formed frame, or stayed connected for at least ReconnectMax. 0
	// means 100ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// BindEndpoint, when set, is bound by one SUB socket that workers' publishers
	// connect to (vLLM endpoint without "*": the PUB connects). "" disables bind mode.
	BindEndpoint string
	// TopicPattern attributes bind-mode messages to workers: {addr} matches the
	// worker's address (host:port), {model} a model name. "" means "kv@{addr}@{model}"
	// (llm-d's convention; vLLM's topic defaults to "").
	TopicPattern string
	// SweepEvery is how often expired speculative entries are swept. 0 means 1s.
	SweepEvery time.Duration
	// PollInterval bounds how long a socket owner waits before checking for
	// cancellation. 0 means 100ms.
	PollInterval time.Duration
	// MaxMessageBytes is set as ZMQ_MAXMSGSIZE on every socket the manager opens: ZMQ
	// closes the connection of a peer that sends a larger message part, before
	// allocating it (counted in Disconnects; the publisher reconnects, the gap is
	// replayed). 0 means DefaultMaxMessageBytes.
	MaxMessageBytes int64
	// ReplayBackoffMin and ReplayBackoffMax bound the per-worker backoff after a replay
	// that got no answer (timeout or socket error): gaps inside the backoff are not
	// replayed (counted in ReplayBackoffs; the worker goes approximate) and live events
	// keep being applied. Doubles per failure, reset by an answered replay. 0 means 1s
	// and 1m.
	ReplayBackoffMin, ReplayBackoffMax time.Duration
	// ReplayBufferFrames and ReplayBufferBytes bound each worker's reorder buffer: a
	// replay runs asynchronously, and the live frames received meanwhile (the one that
	// revealed the gap and every later one) wait there, to be applied in seq order after
	// the replayed range. A frame that would exceed either bound (frames, or payload
	// bytes, summed over the worker's ranks) abandons the pending replays
	// (ReplayBufferOverflows): the buffered frames are applied at once and the worker
	// goes approximate, as after a failed replay. 0 means QueueSize frames (the queue
	// already holds that many unapplied frames) and 2 × MaxMessageBytes; a positive
	// ReplayBufferBytes below MaxMessageBytes is raised to it (one message always fits).
	ReplayBufferFrames int
	ReplayBufferBytes  int64
	// SilentAfter: a worker that expects KV events and has taken traffic (router
	// bookings) for this long without one event batch gets one WARN log line naming its
	// endpoint and mode (checked every SweepEvery). 0 means 1m; negative disables it.
	SilentAfter time.Duration

	// reconnectWait (tests only; nil otherwise) is told each wait before a socket is
	// re-created: the worker ("" for the bind-mode socket), rank, whether the socket
	// that ended was healthy, and the wait.
	reconnectWait func(worker string, rank int, healthy bool, wait time.Duration)
}

// DefaultMaxMessageBytes is the default ZMQ message size cap: 32 MiB. The largest
// legitimate KV event batch is one engine step storing a whole context of fresh
// blocks (a step without chunked prefill schedules up to max_model_len tokens): at
// most 5 bytes per token id (msgpack uint32), 9 bytes per block hash (33 as bin) and
// ~200 bytes of fields per event — for a 1M-token context with 16-token blocks about
// 5.6 MB (7.6 MB with bin hashes). 32 MiB leaves 4× for several such requests in one
// step; raise it for larger contexts.
const DefaultMaxMessageBytes = 32 << 20

// DefaultOptions returns the defaults New gives each zero field (config.Default takes
// its index section from them, so each default is written once, here).
func DefaultOptions() Options {
	return Options{QueueSize: 4096, ReplayTimeout: 2 * time.Second, ReconnectMin: 100 * time.Millisecond,
		ReconnectMax: 5 * time.Second, TopicPattern: "kv@{addr}@{model}", SweepEvery: time.Second,
		PollInterval: 100 * time.Millisecond, MaxMessageBytes: DefaultMaxMessageBytes,
		ReplayBackoffMin: time.Second, ReplayBackoffMax: time.Minute, SilentAfter: time.Minute}
}

// WithDefaults returns opt with the value New gives each zero field: DefaultOptions'
// (SilentAfter only when 0: negative is no warning), ReconnectMax and ReplayBackoffMax at
// least their minimums, ReplayBufferFrames QueueSize and ReplayBufferBytes twice
// MaxMessageBytes (never below MaxMessageBytes, so that one message always fits).
func (opt Options) WithDefaults() Options {
	def := DefaultOptions()
	if opt.QueueSize <= 0 {
		opt.QueueSize = def.QueueSize
	}
	if opt.ReplayTimeout <= 0 {
		opt.ReplayTimeout = def.ReplayTimeout
	}
	if opt.ReconnectMin <= 0 {
		opt.ReconnectMin = def.ReconnectMin
	}
	if opt.ReconnectMax <= 0 {
		opt.ReconnectMax = def.ReconnectMax
	}
	if opt.ReconnectMax < opt.ReconnectMin {
		opt.ReconnectMax = opt.ReconnectMin
	}
	if opt.TopicPattern == "" {
		opt.TopicPattern = def.TopicPattern
	}
	if opt.SweepEvery <= 0 {
		opt.SweepEvery = def.SweepEvery
	}
	if opt.PollInterval <= 0 {
		opt.PollInterval = def.PollInterval
	}
	if opt.SilentAfter == 0 {
		opt.SilentAfter = def.SilentAfter
	}
	if opt.MaxMessageBytes <= 0 {
		opt.MaxMessageBytes = def.MaxMessageBytes
	}
	if opt.ReplayBackoffMin <= 0 {
		opt.ReplayBackoffMin = def.ReplayBackoffMin
	}
	if opt.ReplayBackoffMax <= 0 {
		opt.ReplayBackoffMax = def.ReplayBackoffMax
	}
	opt.ReplayBackoffMax = max(opt.ReplayBackoffMax, opt.ReplayBackoffMin)
	if opt.ReplayBufferFrames <= 0 {
		opt.ReplayBufferFrames = opt.QueueSize
	}
	if opt.ReplayBufferBytes <= 0 {
		opt.ReplayBufferBytes = 2 * opt.MaxMessageBytes
	}
	opt.ReplayBufferBytes = max(opt.ReplayBufferBytes, opt.MaxMessageBytes)
	return opt
}

// Manager runs the subscriptions of every registered worker. It implements
// workers.Listener; subscribe it to the registry. Safe for concurrent use.
type Manager struct {
	opt   Options
	ix    *kvindex.Index
	m     *metrics.Index
	log   *slog.Logger
	topic *regexp.Regexp

	mu     sync.Mutex
	ctx    context.Context       // nil until Run; guarded by mu
	ended  bool                  // Run is waiting for its goroutines: start none; guarded by mu
	subs   map[string]*workerSub // by worker name; guarded by mu
	byAddr map[string]string     // worker address → name, for bind mode; guarded by mu
	byHost map[string][]string   // worker address host (IP) → names, for bind mode; guarded by mu
	// unmatched: topics already logged as attributed to no worker (bounded); guarded by mu
	unmatched map[string]bool
	// silentWarned: workers already warned about as silent (SilentAfter); guarded by mu
	silentWarned map[string]bool
	wg           sync.WaitGroup
	bound        chan string // bind mode: the endpoint actually bound (resolved port)
	// expireReplays (tests only; nil otherwise): a receive ends the replay exchange
	// that gets it as if its ReplayTimeout had passed.
	expireReplays chan struct{}
}

// ErrBadTopicPattern is returned by New for a TopicPattern without {addr}.
var ErrBadTopicPattern = errors.New("zmqsub: topic pattern must contain {addr}")

// New returns a Manager. Nothing connects until Run.
func New(opt Options) (*Manager, error) {
	if opt.Index == nil {
		return nil, errors.New("zmqsub: Options.Index is required")
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewUnregistered().Index
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	opt = opt.WithDefaults()
	re, err := CompileTopicPattern(opt.TopicPattern)
	if err != nil {
		return nil, err
	}
	return &Manager{opt: opt, ix: opt.Index, m: opt.Metrics, log: opt.Logger, topic: re,
		subs: map[string]*workerSub{}, byAddr: map[string]string{}, byHost: map[string][]string{},
		unmatched: map[string]bool{}, silentWarned: map[string]bool{}, bound: make(chan string, 1)}, nil
}

// CompileTopicPattern turns a pattern with {addr} and optional {model} placeholders
// into an anchored regexp with named groups addr and model.
func CompileTopicPattern(p string) (*regexp.Regexp, error) {
	if !strings.Contains(p, "{addr}") {
		return nil, fmt.Errorf("%w: %q", ErrBadTopicPattern, p)
	}
	var b strings.Builder
	b.WriteString("^")
	for rest := p; rest != ""; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(regexp.QuoteMeta(rest))
			break
		}
		b.WriteString(regexp.QuoteMeta(rest[:i]))
		switch {
		case strings.HasPrefix(rest[i:], "{addr}"):
			b.WriteString(`(?P<addr>[^@/]+?)`)
			rest = rest[i+len("{addr}"):]
		case strings.HasPrefix(rest[i:], "{model}"):
			b.WriteString(`(?P<model>.*?)`)
			rest = rest[i+len("{model}"):]
		default:
			b.WriteString(regexp.QuoteMeta("{"))
			rest = rest[i+1:]
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// BindMode reports whether the manager binds a SUB socket for all workers.
func (m *Manager) BindMode() bool { return m.opt.BindEndpoint != "" }

// BoundEndpoint waits for the bind-mode socket and returns its resolved endpoint (with
// the actual port when bound to port 0 or "*"), or "" when ctx ends first.
func (m *Manager) BoundEndpoint(ctx context.Context) string {
	select {
	case ep := <-m.bound:
		m.bound <- ep
		return ep
	case <-ctx.Done():
		return ""
	}
}

// WorkerAdded implements workers.Listener: the worker is indexed and, once Run has
// started, its subscription starts.
func (m *Manager) WorkerAdded(w *workers.Worker) {
	m.ix.SetWorker(m.ix.InfoFor(w, m.BindMode()))
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.subs[w.Name]; old != nil {
		old.stop()
	}
	if old := m.subs[w.Name]; old != nil {
		m.forgetAddrLocked(old.w)
	}
	s := newWorkerSub(m, w)
	m.subs[w.Name] = s
	m.byAddr[w.Address] = w.Name
	if h := hostOf(w.Address); h != "" {
		m.byHost[h] = append(m.byHost[h], w.Name)
	}
	if m.ctx != nil && !m.ended {
		s.start(m.ctx, &m.wg)
	}
}

// WorkerRemoved implements workers.Listener: the subscription stops (its sockets are
// closed by their goroutines) and the worker's entries are released.
func (m *Manager) WorkerRemoved(w *workers.Worker) {
	m.mu.Lock()
	s := m.subs[w.Name]
	delete(m.subs, w.Name)
	delete(m.silentWarned, w.Name)
	if s != nil {
		m.forgetAddrLocked(s.w)
	}
	m.mu.Unlock()
	if s != nil {
		s.stop()
		s.wait()
	}
	m.ix.RemoveWorker(w.Name)
}

// WorkerRestarted tells the manager that worker restarted (its process start time
// changed, workers.ScrapeOptions.OnRestart): every rank's entries and its speculative
// entries are dropped at once and again in order with its queued messages, and each
// rank's next message is a baseline. It is the only early restart signal in bind mode.
// Unknown workers are ignored; a full queue blocks it until there is room or Run ends.
func (m *Manager) WorkerRestarted(name string) {
	m.mu.Lock()
	s, ctx := m.subs[name], m.ctx
	m.mu.Unlock()
	if s == nil {
		return
	}
	m.ix.ResetWorker(name) // now, before the caller marks the worker healthy again
	if ctx != nil {
		// and again in order with the queue (messages of the old engine still queued
		// must not bring its blocks back), where the consumer also resets each rank
		s.enqueueWait(ctx, frame{rank: -1, restarted: true})
	}
}

// Run starts every subscription and blocks until ctx is cancelled; it returns after
// every goroutine it started has exited and closed its sockets. It returns an error
// only when the bind-mode socket cannot be bound.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("zmqsub: Run called twice")
	}
	m.ctx = ctx
	for _, s := range m.subs {
		s.start(ctx, &m.wg)
	}
	m.mu.Unlock()
	errc := make(chan error, 1)
	if m.BindMode() {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if err := m.runBind(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	tk := time.NewTicker(m.opt.SweepEvery)
	defer tk.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tk.C:
			m.ix.Sweep()
			m.checkSilent()
		}
	}
	// A worker added from now on (discovery still running) starts no goroutine: its
	// wg.Add would race with this Wait.
	m.mu.Lock()
	m.ended = true
	m.mu.Unlock()
	m.wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// forgetAddrLocked removes w from the bind-mode address maps.
func (m *Manager) forgetAddrLocked(w *workers.Worker) {
	if m.byAddr[w.Address] == w.Name {
		delete(m.byAddr, w.Address)
	}
	h := hostOf(w.Address)
	names := m.byHost[h]
	for i, n := range names {
		if n == w.Name {
			names = append(names[:i:i], names[i+1:]...)
			break
		}
	}
	if len(names) == 0 {
		delete(m.byHost, h)
	} else {
		m.byHost[h] = names
	}
}

// hostOf is the host part of a worker address ("10.0.0.5:8000" → "10.0.0.5").
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// maxLoggedTopics bounds the set of unmatched topics remembered for logging once.
const maxLoggedTopics = 1024

// dispatch hands a bind-mode message to the worker its topic names: by address
// (host:port), else by host alone when exactly one worker has that host (publishers
// often put only the pod IP in the topic). A bare host that several workers share is
// counted as ambiguous_host, anything else as unmatched_topic; each is logged once per
// topic.
func (m *Manager) dispatch(f frame) {
	var addr string
	if g := m.topic.FindStringSubmatch(f.topic); g != nil {
		addr = g[m.topic.SubexpIndex("addr")]
	}
	m.mu.Lock()
	var s *workerSub
	var sharing []string // workers sharing the topic's bare host, when several do
	if addr != "" {
		s = m.subs[m.byAddr[addr]]
		if s == nil {
			if names := m.byHost[hostOf(addr)]; len(names) == 1 {
				s = m.subs[names[0]]
			} else if len(names) > 1 {
				sharing = append(sharing, names...)
			}
		}
	}
	logIt := false
	if s == nil && !m.unmatched[f.topic] && len(m.unmatched) < maxLoggedTopics {
		m.unmatched[f.topic], logIt = true, true
	}
	m.mu.Unlock()
	if s != nil {
		s.enqueue(f)
		return
	}
	if sharing != nil {
		m.m.DroppedMessages.WithLabelValues("ambiguous_host").Inc()
		if logIt {
			sort.Strings(sharing)
			m.log.Warn("kvindex: bind-mode KV event topic names an ambiguous host, shared by several workers; messages dropped",
				"topic", f.topic, "host", hostOf(addr), "workers", sharing, "expected", m.opt.TopicPattern,
				"hint", "put the worker's address as host:port in the topic (e.g. POD_IP set to ip:port)")
		}
		return
	}
	m.m.DroppedMessages.WithLabelValues("unmatched_topic").Inc()
	if logIt {
		m.log.Warn("kvindex: bind-mode KV event topic matches no worker; messages dropped",
			"topic", f.topic, "expected", m.opt.TopicPattern,
			"hint", "{addr} is a worker's address (host:port) as configured, or its host when exactly one worker has it")
	}
}
