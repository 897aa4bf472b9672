package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/metrics"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/workers"
)

// Defaults of Options' zero fields.
const (
	DefaultInterval         = 25 * time.Millisecond
	DefaultSilenceTimeout   = 3 * time.Second
	DefaultMaxMessageBytes  = 4 << 20
	DefaultMaxWorkers       = 4096
	DefaultMaxKeysPerWorker = 16384
	DefaultMaxPeers         = 64
	DefaultMaxInboundBytes  = 32 << 20
	maxNameBytes            = 253 // a DNS name
)

// Reasons of kvroute_peers_dropped_total and kvroute_peers_expired_total.
const (
	DropMalformed    = "malformed"
	DropStale        = "stale"
	DropSelf         = "self"
	DropTooManyPeers = "too_many_peers"
	DropBusy         = "busy" // a stream or connection past the inbound bounds (inbound.go)
	ExpireSilent     = "silent"
	ExpireStream     = "stream_ended"
)

// Local is this replica's router as the exchange sees it; *router.Router implements it.
type Local interface {
	Changes() uint64
	LocalBookings(maxKeys int) []router.WorkerBookings
	SetPeerBookings(map[string]router.PeerWorker)
}

// Index is where peers' block keys being prefilled become speculative entries;
// *kvindex.Index implements it.
type Index interface {
	Book(worker string, keys []kvindex.Key) kvindex.Booking
	Withdraw(b kvindex.Booking) int
}

// Options configures a Manager. Zero values take the defaults above.
type Options struct {
	ID     string // this replica's id, unique among peers; "" = hostname and a random suffix
	Router Local  // required
	Index  Index  // nil: peers' keys are not imported
	// Interval is the coalescing period: local changes are sent at most once per
	// Interval (the first change after a quiet Interval at once), and silent peers
	// are looked for as often.
	Interval time.Duration
	// SilenceTimeout drops a peer's state (its bookings and imported entries) when
	// nothing arrived from it for this long; a summary is re-sent at least every
	// SilenceTimeout/3 while nothing changes.
	SilenceTimeout   time.Duration
	MaxMessageBytes  int // one summary, bytes (received: grpc.MaxRecvMsgSize; sent: keys are cut to fit)
	MaxWorkers       int // workers per summary
	MaxKeysPerWorker int // block keys per worker per summary
	MaxPeers         int // peer states held (inbound streams: twice as many; connections: inbound.go)
	// MaxInboundBytes bounds the summaries received, decoded or applied at once over
	// every connection: MaxInboundBytes/MaxMessageBytes of them (at least one;
	// inbound.go). 0 = DefaultMaxInboundBytes.
	MaxInboundBytes int
	// Auth authenticates the exchange both ways (zero: none; peers are then admitted
	// only from a target's address).
	Auth Auth
	// Claims bounds what one peer may claim on one worker (Claims; zero fields take
	// DefaultClaims').
	Claims  Claims
	Metrics *metrics.Peers // nil: an unregistered set
	Logger  *slog.Logger
	Now     func() time.Time
}

// Manager exchanges booking summaries with peer replicas: it streams this replica's
// summary to every target (WorkerAdded/WorkerRemoved of a peer registry: static list
// or discovery) and applies the summaries peers stream to it. Safe for concurrent use.
type Manager struct {
	o           Options
	incarnation uint64
	lim         Limits
	in          *inbound

	cur atomic.Pointer[built] // the latest summary, encoded

	dirty chan struct{} // one slot: the peers' state changed since the last publish
	pubMu sync.Mutex    // serializes publish; taken before mu

	mu      sync.Mutex // guards everything below; never taken on the request path
	peers   map[string]*peerState
	targets map[string]*target // by address
	runCtx  context.Context    // nil until Run
	wg      sync.WaitGroup
	gen     uint64 // inbound stream ids

	sent, recv atomic.Uint64
}

type built struct {
	seq     uint64
	b       []byte
	changed chan struct{} // closed when a newer summary is built
	workers int
	keys    int
}

type peerState struct {
	id          string
	remote      string
	incarnation uint64
	seq         uint64
	stream      uint64
	last        time.Time
	msgs, bytes uint64
	workers     map[string]*imported
	total       scoring.Booked
}

// imported is what one peer reported for one worker.
type imported struct {
	booked              scoring.Booked
	oldest              time.Time
	firstTokens, finish []time.Time
	writes              router.PeerWrites
	KeyImport
}

// KeyImport is the block keys one peer reports as being prefilled on one worker, and
// the speculative index entries this replica booked for them. The receiver
// (Manager) and kvbench's virtual replicas keep one per peer × worker.
type KeyImport struct {
	keys     map[kvindex.Key]struct{}
	list     []kvindex.Key // keys, in reported order
	bookings []kvindex.Booking
}

// Update replaces the reported key set with keys (a peer's latest summary for
// worker): keys not reported before are booked in ix as speculative entries (ix nil:
// none), and a booking none of whose keys is still reported is forgotten — its
// entries are then confirmed by the worker's own KV events or expire. Re-booking
// every key at every summary instead would churn the index: each Book adds FIFO
// entries, and a long prefill reported 40 times a second would push the worker's
// confirmed entries out. Returns how many keys were new.
func (im *KeyImport) Update(ix Index, worker string, keys []kvindex.Key) int {
	next := make(map[kvindex.Key]struct{}, len(keys))
	list := make([]kvindex.Key, 0, len(keys))
	var fresh []kvindex.Key
	for _, k := range keys {
		if _, dup := next[k]; dup {
			continue
		}
		if _, ok := im.keys[k]; !ok {
			fresh = append(fresh, k)
		}
		next[k] = struct{}{}
		list = append(list, k)
	}
	im.keys, im.list = next, list
	if ix == nil {
		return len(fresh)
	}
	kept := im.bookings[:0]
	for _, b := range im.bookings {
		for _, k := range b.Keys() {
			if _, ok := next[k]; ok {
				kept = append(kept, b)
				break
			}
		}
	}
	clear(im.bookings[len(kept):])
	im.bookings = kept
	// In batches: each Book holds the worker's index lock (which the expiry sweep and
	// the KV event path take too) for one batch only.
	for rest := fresh; len(rest) > 0; {
		n := min(len(rest), bookBatch)
		if b := ix.Book(worker, rest[:n]); b.Len() > 0 {
			im.bookings = append(im.bookings, b)
		}
		rest = rest[n:]
	}
	return len(fresh)
}

// Keys is the number of keys last reported.
func (im *KeyImport) Keys() int { return len(im.keys) }

// Reported returns the keys last reported, deduplicated, in reported order (what
// router.PeerWorker.Add takes); not to be modified.
func (im *KeyImport) Reported() []kvindex.Key { return im.list }

// New returns a Manager; Run starts it.
func New(o Options) (*Manager, error) {
	if o.Router == nil {
		return nil, errors.New("peers: Options.Router is required")
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.SilenceTimeout <= 0 {
		o.SilenceTimeout = DefaultSilenceTimeout
	}
	if o.SilenceTimeout < 4*o.Interval {
		return nil, fmt.Errorf("peers: silence timeout %s must be ≥ 4 × interval %s", o.SilenceTimeout, o.Interval)
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.MaxWorkers <= 0 {
		o.MaxWorkers = DefaultMaxWorkers
	}
	if o.MaxKeysPerWorker <= 0 {
		o.MaxKeysPerWorker = DefaultMaxKeysPerWorker
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = DefaultMaxPeers
	}
	if o.MaxInboundBytes <= 0 {
		o.MaxInboundBytes = DefaultMaxInboundBytes
	}
	o.Claims = o.Claims.withDefaults()
	if o.Metrics == nil {
		o.Metrics = metrics.NewUnregistered().Peers
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ID == "" {
		o.ID = DefaultID()
	}
	if len(o.ID) > maxNameBytes {
		return nil, fmt.Errorf("peers: id %q longer than %d bytes", o.ID, maxNameBytes)
	}
	m := &Manager{o: o, incarnation: rand.Uint64() | 1, peers: map[string]*peerState{}, targets: map[string]*target{},
		in: newInbound(o.MaxInboundBytes / o.MaxMessageBytes), dirty: make(chan struct{}, 1),
		lim: Limits{MaxWorkers: o.MaxWorkers, MaxKeysPerWorker: o.MaxKeysPerWorker, MaxNameBytes: maxNameBytes}}
	m.cur.Store(&built{changed: make(chan struct{})})
	return m, nil
}

// ID returns this replica's id.
func (m *Manager) ID() string { return m.o.ID }

// WorkerAdded makes w.Address ("host:port" of a peer's peers listener) a target: this
// replica's summaries are streamed to it. The peer registry is a workers.Registry
// filled by the static list or a discovery source, so its "workers" are replicas.
func (m *Manager) WorkerAdded(w *workers.Worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.targets[w.Address]; ok {
		return
	}
	t := &target{addr: w.Address}
	if host, _, err := net.SplitHostPort(w.Address); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			t.ips.Store(&[]netip.Addr{ip.Unmap()}) // known at once; names resolve at each dial
		}
	}
	m.targets[w.Address] = t
	if m.runCtx != nil {
		m.startLocked(t)
	}
}

// WorkerRemoved stops streaming to w.Address. The peer's state, if it streams to this
// replica, goes with its own stream or silence.
func (m *Manager) WorkerRemoved(w *workers.Worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.targets[w.Address]; ok {
		if t.cancel != nil {
			t.cancel()
		}
		delete(m.targets, w.Address)
	}
}

func (m *Manager) startLocked(t *target) {
	ctx, cancel := context.WithCancel(m.runCtx)
	t.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.sendLoop(ctx, t)
	}()
}

// Run serves peers' streams on ln, streams this replica's summaries to every target,
// and expires silent peers, until ctx is cancelled. It returns after every goroutine
// it started has ended.
func (m *Manager) Run(ctx context.Context, ln net.Listener) error {
	srv := grpc.NewServer(append(m.serverOptions(), grpc.ForceServerCodec(codec{}), grpc.MaxRecvMsgSize(m.o.MaxMessageBytes),
		grpc.MaxConcurrentStreams(uint32(2*m.o.MaxPeers)), grpc.InitialWindowSize(flowWindow), grpc.InitialConnWindowSize(flowWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idleConnTimeout}))...)
	ln = &limitListener{Listener: ln, max: int64(maxConnsPerPeer * m.o.MaxPeers), onDrop: func() { m.o.Metrics.Dropped.WithLabelValues(DropBusy).Inc() }}
	srv.RegisterService(&serviceDesc, m)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.publishLoop(ctx)
	}()
	m.mu.Lock()
	m.runCtx = ctx
	for _, t := range m.targets {
		m.startLocked(t)
	}
	m.mu.Unlock()

	// Leading-edge coalescing: a change is sent at once when the last summary is at
	// least Interval old, else when Interval has passed since it — at most one summary
	// per Interval, and a request routed after a quiet spell reaches the peers after
	// the transit time alone, not up to an Interval later. (A fixed ticker delayed
	// every change by up to an Interval; in that window a peer routes the next request
	// for the same new prefix blind: BENCHMARKS.md "Replicas".) The router's change
	// signal wakes the loop; without one (a Local that lacks it) the timer polls.
	var notify <-chan struct{}
	if n, ok := m.o.Router.(interface{ ChangeSignal() <-chan struct{} }); ok {
		notify = n.ChangeSignal()
	}
	tm := time.NewTimer(m.o.Interval)
	defer tm.Stop()
	var lastChanges uint64
	var lastBuilt time.Time // m.o.Now's clock (summary stamps, heartbeat)
	var sentAt time.Time    // the monotonic clock (coalescing)
	var err error
loop:
	for {
		now := m.o.Now()
		c := m.o.Router.Changes()
		pending := c != lastChanges
		if lastBuilt.IsZero() || (pending && time.Since(sentAt) >= m.o.Interval) || now.Sub(lastBuilt) >= m.o.SilenceTimeout/3 {
			lastChanges, lastBuilt, sentAt = c, now, time.Now()
			m.build(now)
			pending = false
		}
		m.expire(now)
		wait, wake := m.o.Interval, notify // expiry is checked at least every Interval
		if pending {
			wait, wake = max(0, m.o.Interval-time.Since(sentAt)), nil // a change waits for its turn
		}
		tm.Reset(wait)
		select {
		case <-ctx.Done():
			break loop
		case err = <-serveErr:
			break loop
		case <-tm.C:
		case <-wake:
		}
	}
	cancel()
	srv.Stop() // ends inbound streams: their peers' states are dropped
	m.wg.Wait()
	m.dropAll()
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// build encodes the current local bookings as the next summary and wakes the senders.
func (m *Manager) build(now time.Time) {
	local := m.o.Router.LocalBookings(m.o.MaxKeysPerWorker)
	sort.Slice(local, func(i, j int) bool { return local[i].Worker < local[j].Worker })
	if len(local) > m.o.MaxWorkers {
		local = local[:m.o.MaxWorkers]
	}
	prev := m.cur.Load()
	s := &Summary{Replica: m.o.ID, Incarnation: m.incarnation, Seq: prev.seq + 1, Sent: now,
		Workers: make([]WorkerSummary, len(local))}
	keys := 0
	for i, l := range local {
		s.Workers[i] = WorkerSummary{Worker: l.Worker, Booked: l.Booked, OldestPrefill: l.OldestPrefill, Keys: l.Keys,
			Writes: l.Writes, FirstTokens: l.FirstTokens, Finished: l.Finished}
		keys += len(l.Keys)
	}
	b := encode(make([]byte, 0, 64+len(local)*56+keys*8), s)
	for len(b) > m.o.MaxMessageBytes && keys > 0 {
		// Too large: halve every worker's keys (the prefix's first blocks matter most).
		keys = 0
		for i := range s.Workers {
			s.Workers[i].Keys = s.Workers[i].Keys[:len(s.Workers[i].Keys)/2]
			keys += len(s.Workers[i].Keys)
		}
		b = encode(b[:0], s)
	}
	m.cur.Store(&built{seq: s.Seq, b: b, changed: make(chan struct{}), workers: len(s.Workers), keys: keys})
	close(prev.changed)
}

var errSelf = status.Error(codes.FailedPrecondition, "peers: this stream comes from this replica itself")

// apply replaces the sender's state with s.
func (m *Manager) apply(s *Summary, gen uint64, remote string, n int) error {
	if s.Replica == m.o.ID {
		m.o.Metrics.Dropped.WithLabelValues(DropSelf).Inc()
		return errSelf
	}
	now := m.o.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[s.Replica]
	switch {
	case p == nil:
		if !m.knownLocked(remote) {
			m.o.Metrics.Dropped.WithLabelValues(DropUnknownPeer).Inc()
			return status.Errorf(codes.PermissionDenied, "peers: %s is not a known peer address and peers are not authenticated (peers.token, peers.tls)", remote)
		}
		if len(m.peers) >= m.o.MaxPeers {
			m.o.Metrics.Dropped.WithLabelValues(DropTooManyPeers).Inc()
			return status.Errorf(codes.ResourceExhausted, "peers: already %d peers (peers.max_peers)", m.o.MaxPeers)
		}
		p = &peerState{id: s.Replica, workers: map[string]*imported{}}
		m.peers[s.Replica] = p
	case p.incarnation != s.Incarnation:
		m.dropLocked(p, "") // restarted: its old bookings are gone
		p.workers = map[string]*imported{}
	case s.Seq <= p.seq:
		m.o.Metrics.Dropped.WithLabelValues(DropStale).Inc()
		return nil
	}
	p.incarnation, p.seq, p.stream, p.last, p.remote = s.Incarnation, s.Seq, gen, now, remote
	p.msgs++
	p.bytes += uint64(n)
	p.total = scoring.Booked{}
	clampSent(s, now)
	seen := make(map[string]bool, len(s.Workers))
	for i := range s.Workers {
		ws := &s.Workers[i]
		if seen[ws.Worker] {
			continue
		}
		seen[ws.Worker] = true
		if m.o.Claims.clamp(ws, s.Sent) {
			m.o.Metrics.Clamped.Inc()
		}
		im := p.workers[ws.Worker]
		if im == nil {
			im = &imported{}
			p.workers[ws.Worker] = im
		}
		im.booked, im.oldest = ws.Booked, ws.OldestPrefill
		im.firstTokens, im.finish = ws.FirstTokens, ws.Finished
		im.writes = router.PeerWrites{Tokens: ws.Writes, At: s.Sent}
		p.total.AddShared(ws.Booked)
		m.importKeys(ws.Worker, im, ws.Keys)
	}
	for name := range p.workers {
		if !seen[name] {
			// No more bookings there: its requests ended or passed their prefill, so
			// the worker's own KV events now confirm (or never will) those blocks.
			delete(p.workers, name)
		}
	}
	m.markDirty()
	return nil
}

// importKeys books the keys not imported before as speculative entries on worker and
// forgets bookings none of whose keys is still reported (KeyImport.Update).
func (m *Manager) importKeys(worker string, im *imported, keys []kvindex.Key) {
	if n := im.Update(m.o.Index, worker, keys); n > 0 && m.o.Index != nil {
		m.o.Metrics.KeysImported.Add(float64(n))
	}
}

// dropLocked withdraws p's imported entries; with a reason it counts the expiry.
func (m *Manager) dropLocked(p *peerState, reason string) {
	for _, im := range p.workers {
		for _, b := range im.bookings {
			if m.o.Index != nil {
				m.o.Index.Withdraw(b)
			}
		}
	}
	p.workers = map[string]*imported{}
	p.total = scoring.Booked{}
	m.o.Metrics.StateAge.DeleteLabelValues(p.id)
	if reason != "" {
		m.o.Metrics.Expired.WithLabelValues(reason).Inc()
		m.o.Logger.Info("peer state dropped", "peer", p.id, "reason", reason)
	}
}

// expire drops peers silent for SilenceTimeout and updates the state age gauges.
func (m *Manager) expire(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for id, p := range m.peers {
		age := now.Sub(p.last)
		if age > m.o.SilenceTimeout {
			m.dropLocked(p, ExpireSilent)
			delete(m.peers, id)
			changed = true
			continue
		}
		m.o.Metrics.StateAge.WithLabelValues(id).Set(age.Seconds())
	}
	if changed {
		m.markDirty()
	}
}

// dropAll drops every peer's state (its bookings and imported entries) and publishes.
func (m *Manager) dropAll() {
	m.mu.Lock()
	for id, p := range m.peers {
		m.dropLocked(p, "")
		delete(m.peers, id)
	}
	m.mu.Unlock()
	m.publish()
}

// markDirty asks the publisher to hand the peers' bookings to the router. One-slot,
// non-blocking: any number of applies while a publish runs cost one more publish, not
// one each (each is O(peers × workers), and the router's duplicate count O(keys)).
// Caller may hold m.mu.
func (m *Manager) markDirty() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
}

// publishLoop publishes after every markDirty, coalesced, until ctx ends.
func (m *Manager) publishLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.dirty:
			m.publish()
		}
	}
}

// publish hands the sum of every peer's bookings per worker to the router. The sum
// is built under m.mu (the reported slices are replaced, never modified, by later
// summaries, so they are shared, not copied) and handed over outside it; pubMu keeps
// publishes in order, so the router ends with the latest.
func (m *Manager) publish() {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	sum := map[string]router.PeerWorker{}
	total := 0
	m.mu.Lock()
	for _, p := range m.peers {
		for name, im := range p.workers {
			b := sum[name]
			b.Add(im.booked, im.firstTokens, im.finish, im.writes, im.Reported())
			sum[name] = b
			total += im.booked.Requests
		}
	}
	live := len(m.peers)
	m.mu.Unlock()
	m.o.Router.SetPeerBookings(sum)
	m.o.Metrics.Live.Set(float64(live))
	m.o.Metrics.BookingsImported.Set(float64(total))
}
