package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/response"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workers"
)

// VirtualOptions configures a virtual-time cluster run: N simulated engines behind
// kvroute's router core (in process), everything on one discrete-event clock.
type VirtualOptions struct {
	Workers int
	Profile sim.Profile
	Policy  string // a scoring.PolicyNames entry (or bench's own random/round_robin)
	// PolicyImpl, when set, is used instead of looking Policy up by name.
	PolicyImpl scoring.Policy
	Arrivals   Arrivals
	Seed       uint64
	// EventLag delays KV events from an engine to the index (ZMQ + decode latency).
	EventLag time.Duration
	// SpeculativeTTL of the index (kvroute's index.speculative_ttl); 0 means 30 s.
	SpeculativeTTL time.Duration
	// ScrapeInterval of the workers' /metrics load view; 0 means 1 s.
	ScrapeInterval time.Duration
	// NewFeeder builds the index feeder; nil means WireFeeder (vLLM wire payloads through
	// Index.ApplyPayload). NewStoreFeeder selects the Store/Remove path.
	NewFeeder func(ix *kvindex.Index, seed kvindex.Key) IndexFeeder
	// Progress, when set, is called after each completed request.
	Progress func(done, total int)
	// Speeds are the workers' true speed factors (engine step time ÷ factor; worker i
	// gets Speeds[i], missing entries 1): a heterogeneous pool.
	Speeds []float64
	// Slowdowns change a worker's speed during the run.
	Slowdowns []Slowdown
	// KnownSpeeds tells the registry each worker's true initial speed (its profile's
	// prefill and decode rates scaled by it). False: every worker is configured with the
	// plain profile, as when an operator lists mixed or degraded GPUs alike. Slowdowns are
	// never announced.
	KnownSpeeds bool
	// Replicas is the number of kvroute replicas (0 or 1: one). Arrivals are spread over
	// them round robin by item (a load balancer in front of the replicas); each replica
	// has its own index (fed the same KV events: every replica subscribes to every
	// worker), its own bookings, policy state and scrape view.
	Replicas int
	// Share makes the replicas exchange bookings as package peers does: every
	// ExchangeInterval each replica's LocalBookings reach every other one ExchangeDelay
	// later, replacing what it held from that sender (bookings added to the workers'
	// Booked, block keys being prefilled booked as speculative entries). False: blind
	// replicas.
	Share bool
	// ExchangeSync also sends a replica's summary to every peer at once after each of
	// its picks (no delay, before the next pick): the limit the real exchange
	// approaches, in which N replicas see exactly what one would.
	ExchangeSync bool
	// PeerState sets scoring.Options.PeerState on the replicas' policies.
	PeerState bool
	// ExchangeInterval is the coalescing period (peers.interval); 0 means 25 ms.
	ExchangeInterval time.Duration
	// ExchangeDelay is the transit time of a summary (network + decode); 0 means none.
	ExchangeDelay time.Duration
	// QoS, when set, puts kvroute's queue in front of the pick: admission.FairQueue, the
	// same ordering core `kvroute serve`/`proxy` run, here in virtual time (kvbench
	// --qos). nil: every request is picked on arrival, as before.
	QoS *VirtualQoS
	// Admission, when set (and QoS is not), makes every request one of this class, from
	// one tenant: its pick decides through admission.Policy as `kvroute serve` and
	// `proxy` do (on_slo_miss: refuse answers at once when no worker is predicted within
	// the objective; a queue_limit waits in the FairQueue as under QoS). kvbench
	// --admission.
	Admission *config.Class
	// High, with Admission and HighShare > 0, is a second class: each request is in it
	// with probability HighShare (drawn from Seed), from tenant "high"; the rest are in
	// Admission, from tenant "all" (kvbench --priority-share).
	High      *config.Class
	HighShare float64
	// CacheTurnover turns on kvroute's cache-turnover price (scoring.Options.CacheTurnover,
	// config scoring.cache_turnover; kvbench --cache-turnover).
	CacheTurnover bool
	// UtilizationBacklog scales kvroute's utilization ρ by offered ÷ served tokens
	// (scoring.Options.UtilizationBacklog, config scoring.utilization_backlog; kvbench
	// --utilization-backlog).
	UtilizationBacklog bool
	// KVWait prices a KV-full worker's queue by the time its running requests take to
	// free the blocks (scoring.Options.KVWait, config scoring.kv_wait; kvbench --kv-wait).
	KVWait bool
	// Roles are the workers' prefill/decode roles (worker i gets Roles[i], missing
	// entries aggregated): a request picked with a remote prefill runs its prefill leg
	// on that worker's engine and its decode there, reading the KV (pd.go).
	Roles []workers.Role
}

// VirtualQoS is a virtual run's QoS: who each request is from and its class. A request
// whose class has a queue and finds every worker busy and none predicted within the
// class objective (router.ErrWait) waits; it is dispatched when a ticket ends or gets
// its first token (router.OnCapacity), in FairQueue's order (priority, then VTC across
// tenants when Fair, then FCFS); past the class's max_queue_time it fails with
// admission.ReasonQueueTimeout.
type VirtualQoS struct {
	Tenant   func(item int) string
	Class    func(tenant string) config.Class
	Fair     bool
	QueueMax int // 0: 10,000
}

func (o *VirtualOptions) role(i int) workers.Role {
	if i < len(o.Roles) {
		return o.Roles[i]
	}
	return workers.RoleAggregated
}

func (o *VirtualOptions) speed(i int) float64 {
	if i < len(o.Speeds) {
		return o.Speeds[i]
	}
	return 1
}

// virtualStart is the virtual epoch (any fixed instant works; fixed for reproducibility).
var virtualStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// WorkerNames returns the names virtual runs give their workers.
func WorkerNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("w%02d", i)
	}
	return out
}

// RunVirtual replays w on a virtual cluster and returns one Result per item.
func RunVirtual(w *Workload, o VirtualOptions) ([]Result, error) {
	if o.Workers <= 0 {
		return nil, fmt.Errorf("bench: virtual cluster needs at least one worker")
	}
	if o.SpeculativeTTL == 0 {
		o.SpeculativeTTL = 30 * time.Second
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = time.Second
	}
	if o.Admission != nil && o.QoS == nil {
		o.QoS = admissionQoS(&o, len(w.Items))
	}
	prof := o.Profile
	clock := sim.NewClock(virtualStart)
	policy := o.PolicyImpl
	if policy == nil {
		var err error
		if policy, err = newPolicy(o.Policy, o.scoringOptions(rand.New(rand.NewPCG(o.Seed, 0x901c)))); err != nil {
			return nil, err
		}
	}
	if len(o.Speeds) > o.Workers {
		return nil, fmt.Errorf("bench: %d worker speeds for %d workers", len(o.Speeds), o.Workers)
	}
	for i, f := range o.Speeds {
		if !(f > 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("bench: worker %d speed %v: must be positive", i, f)
		}
	}
	for _, sd := range o.Slowdowns {
		if sd.Worker < 0 || sd.Worker >= o.Workers || !(sd.Factor > 0) {
			return nil, fmt.Errorf("bench: slowdown of worker %d by %v: no such worker or factor not positive", sd.Worker, sd.Factor)
		}
	}
	names := WorkerNames(o.Workers)
	nrep := max(o.Replicas, 1)
	adapters := w.Adapters()
	reps := make([]*replicaState, nrep)
	for ri := range reps {
		reg := workers.NewRegistry()
		var ws []*workers.Worker
		for i, n := range names {
			known := 1.0
			if o.KnownSpeeds {
				known = o.speed(i)
			}
			ws = append(ws, &workers.Worker{Name: n, Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Models: append([]string{prof.Model}, adapters...), Role: o.role(i),
				Profile: workers.Profile{PrefillTokensPerSecond: prof.PrefillTokensPerSecond() * known, DecodeTokensPerSecond: prof.DecodeTokensPerSecond() * known,
					Overhead: time.Duration(float64(prof.StepOverhead)/known) + prof.RequestOverhead, BlockCapacity: prof.NumBlocks}})
		}
		reg.Set(ws)
		ix := kvindex.New(kvindex.Options{SpeculativeTTL: o.SpeculativeTTL, Now: clock.Now,
			Models: []kvindex.Model{{Name: prof.Model, BlockSize: prof.BlockSize}}})
		nsSeed := kvindex.Namespace{Model: prof.Model}.Seed()
		var feeder IndexFeeder
		if o.NewFeeder != nil {
			feeder = o.NewFeeder(ix, nsSeed)
		} else {
			feeder = &WireFeeder{Index: ix, Model: prof.Model}
		}
		pol := policy
		if ri > 0 { // each replica learns on its own
			var err error
			if o.PolicyImpl != nil {
				return nil, fmt.Errorf("bench: PolicyImpl with %d replicas", nrep)
			}
			if pol, err = newPolicy(o.Policy, o.scoringOptions(rand.New(rand.NewPCG(o.Seed, 0x901c+uint64(ri))))); err != nil {
				return nil, err
			}
		}
		rt := router.New(router.Options{Registry: reg, Index: ix, Policy: pol, Now: clock.Now,
			Models:     append([]router.Model{{Name: prof.Model, BlockSize: prof.BlockSize, KVBytesPerToken: prof.KVBytesPerToken}}, adapterModels(adapters, prof)...),
			Saturation: router.Saturation{BatchTokens: prof.MaxBatchTokens, MaxNumSeqs: prof.MaxNumSeqs}})
		reps[ri] = &replicaState{reg: reg, ix: ix, feeder: feeder, rt: rt, from: map[int]map[string]*peerImport{}}
	}
	feeder := multiFeeder(reps)

	results := make([]Result, len(w.Items))
	remaining := len(w.Items)
	done := 0
	type state struct {
		idx     int
		ticket  *router.Ticket
		sent    time.Time
		first   time.Time
		chain   []int
		pos     int
		tenant  string
		cls     config.Class
		req     *request.Request
		toks    []uint32
		release func() // frees the remote prefill's held blocks (pd.go); nil none
	}
	engines := map[string]*sim.VirtualEngine{}
	var fq *admission.FairQueue
	if o.QoS != nil {
		qm := o.QoS.QueueMax
		if qm <= 0 {
			qm = 10000
		}
		fq = admission.NewFairQueue(qm, queueLimits{}, o.QoS.Fair)
	}
	var next func(chain []int, pos int)
	var streamQ func() // starts the next chain in streams mode; nil otherwise
	finish := func(st *state) {
		remaining--
		done++
		if o.Progress != nil {
			o.Progress(done, len(w.Items))
		}
		if st.pos+1 < len(st.chain) {
			nx := st.chain[st.pos+1]
			clock.After(w.Items[nx].Think, func() { next(st.chain, st.pos+1) })
		} else if streamQ != nil {
			streamQ()
		}
	}
	for i, n := range names {
		eng, err := sim.NewEngine(prof, uint64(i+1)*0x9e3779b97f4a7c15^o.Seed)
		if err != nil {
			return nil, err
		}
		if err := eng.SetSpeed(o.speed(i)); err != nil {
			return nil, err
		}
		name := n
		onOut := func(out sim.Output) {
			if leg, ok := out.Req.Tag.(*pdLeg); ok {
				leg.output(out)
				return
			}
			st := out.Req.Tag.(*state)
			now := clock.Now()
			r := &results[st.idx]
			if out.First {
				st.first = now
				r.TTFT = now.Sub(st.sent)
				r.CachedTokens, r.AdapterLoad = out.CachedTokens-out.RemoteTokens, out.LoRALoaded // KV read from a prefill worker is not a cache hit
				if st.release != nil {                                                            // the decode engine has read the prefill's KV
					st.release()
					st.release = nil
				}
				st.ticket.FirstToken(now)
			}
			if out.Finished {
				r.E2E = now.Sub(st.sent)
				r.OutputTokens = out.Generated
				if out.Generated > 1 {
					r.ITL = now.Sub(st.first) / time.Duration(out.Generated-1)
				}
				if fq != nil {
					fq.Charge(st.tenant, float64(out.Generated)) // VTC: output served
				}
				st.ticket.Done(200, response.Usage{PromptTokens: r.PromptTokens, CompletionTokens: out.Generated, CachedTokens: out.CachedTokens, CachedReported: out.CachedTokens > 0, Present: true}, now)
				finish(st)
			}
		}
		onBatch := func(b sim.Batch) {
			if o.EventLag <= 0 {
				feeder.Apply(name, b)
				return
			}
			clock.After(o.EventLag, func() { feeder.Apply(name, b) })
		}
		engines[n] = sim.NewVirtualEngine(eng, clock, onOut, onBatch)
	}

	var syncEx func(si int)
	ctx := context.Background()
	fail := func(st *state, why string) {
		results[st.idx].Err = why
		finish(st)
	}
	// dispatch picks for st; false when the router says wait (router.ErrWait).
	dispatch := func(st *state) bool {
		i := st.idx
		r := &results[i]
		po := router.PickOptions{RequestID: fmt.Sprintf("req-%d", i)}
		if fq != nil {
			// as admission's Admitter does: the objective less the time queued
			cp := admission.AtDispatch(admission.Policy(&st.cls, 0, true), clock.Now().Sub(st.sent))
			po.Classify = func(int) router.ClassPolicy { return cp }
		}
		wall := time.Now()
		t, err := reps[i%nrep].rt.Pick(ctx, st.req, po)
		if errors.Is(err, router.ErrWait) {
			return false
		}
		if _, ok := router.AsSLOMiss(err); ok {
			r.RefuseWall = time.Since(wall) // the router's own time to refuse (wall clock)
			fail(st, router.ReasonSLOMiss)
			return true
		}
		if err != nil {
			fail(st, err.Error())
			return true
		}
		st.ticket = t
		if syncEx != nil {
			syncEx(i % nrep)
		}
		r.Worker, r.PrefillWorker = t.Worker, t.PrefillWorker
		r.Predicted = t.Predicted.TTFT
		r.Queued = clock.Now().Sub(st.sent)
		if fq != nil {
			fq.Charge(st.tenant, float64(t.PromptTokens)) // VTC: prompt served at dispatch
		}
		if err := submit(engines, t, &sim.Request{ID: fmt.Sprintf("req-%d", i), Prompt: st.toks, MaxTokens: w.Items[i].MaxTokens, LoRA: w.Items[i].Adapter, Tag: st}, &st.release); err != nil {
			t.Abort()
			fail(st, err.Error())
		}
		return true
	}
	expire := func() {
		for _, e := range fq.Expire(clock.Now()) {
			fail(e.Tag.(*state), admission.ReasonQueueTimeout)
		}
	}
	// drain dispatches what fits, in FairQueue's order, skipping (within the round's
	// scan) entries told to wait
	drain := func() {
		expire()
		for e := fq.Pop(); e != nil; e = fq.Pop() {
			if !dispatch(e.Tag.(*state)) {
				fq.Refuse(e)
			}
		}
	}
	if fq != nil {
		pending := false
		wake := func() { // called inside engine callbacks: drain on the clock, once per instant
			if !pending {
				pending = true
				clock.After(0, func() { pending = false; fq.Round(); drain() })
			}
		}
		for _, rp := range reps {
			rp.rt.OnCapacity(wake)
		}
	}
	enqueue := func(st *state) {
		now := clock.Now()
		e := &admission.Entry{Tenant: st.tenant, Class: st.cls.Name, Priority: st.cls.Priority, Deadline: now.Add(st.cls.MaxQueueTime), Tag: st}
		shed, reason := fq.Push(e, now)
		if reason != "" {
			fail(st, reason)
			return
		}
		if shed != nil {
			fail(shed.Tag.(*state), admission.ReasonShed)
		}
		clock.At(e.Deadline, expire)
	}
	next = func(chain []int, pos int) {
		i := chain[pos]
		it := &w.Items[i]
		toks := it.EngineTokens()
		now := clock.Now()
		r := &results[i]
		*r = Result{Index: i, Start: now.Sub(virtualStart), PromptTokens: len(toks)}
		st := &state{idx: i, sent: now, chain: chain, pos: pos, toks: toks,
			req: &request.Request{API: request.APICompletions, Model: cmp.Or(it.Adapter, prof.Model), PromptTokenIDs: [][]uint32{toks}, MaxTokens: it.MaxTokens, Stream: true}}
		if fq == nil {
			dispatch(st)
			return
		}
		st.tenant = o.QoS.Tenant(i)
		st.cls = o.QoS.Class(st.tenant)
		r.Tenant, r.Class = st.tenant, st.cls.Name
		if st.cls.QueueLimit > 0 {
			fq.SetLimit(st.cls.Name, st.cls.QueueLimit)
		}
		// arrivals join a non-empty queue in their order rather than overtaking it,
		// and the round goes on (an arrival may fit where those refused did not); an
		// empty queue tries the pick at once
		if fq.Len() > 0 && st.cls.QueueLimit > 0 {
			enqueue(st)
			drain()
		} else if !dispatch(st) {
			enqueue(st)
		}
	}
	cs := chains(w)
	if o.Arrivals.Kind == "streams" {
		k := 0
		streamQ = func() {
			if k < len(cs) {
				c := cs[k]
				k++
				clock.After(0, func() { next(c, 0) })
			}
		}
		for s := 0; s < o.Arrivals.Streams; s++ {
			streamQ()
		}
	} else {
		for _, c := range cs {
			c := c
			clock.At(virtualStart.Add(w.Items[c[0]].At), func() { next(c, 0) })
		}
	}
	for _, sd := range o.Slowdowns {
		eng := engines[names[sd.Worker]].Engine
		f := sd.Factor
		clock.At(virtualStart.Add(sd.At), func() { _ = eng.SetSpeed(eng.Speed() / f) })
	}
	var scrape func()
	scrape = func() {
		for _, n := range names {
			s := engines[n].Engine.Stats()
			for _, rp := range reps {
				rp.reg.SetLoad(n, workers.Load{Waiting: float64(s.Waiting), Running: float64(s.Running), KVUsage: s.KVUsage, ScrapedAt: clock.Now(),
					Adapters: scrapedAdapters(s, prof)})
			}
		}
		if remaining > 0 {
			clock.After(o.ScrapeInterval, scrape)
		}
	}
	scrape()
	if nrep > 1 && o.Share {
		iv := o.ExchangeInterval
		if iv <= 0 {
			iv = 25 * time.Millisecond
		}
		// Leading-edge coalescing, as package peers sends: a replica's change goes out
		// at once when its last summary is at least iv old, else when iv has passed
		// since it (at most one summary per iv; polled every millisecond of virtual time).
		poll := min(time.Millisecond, iv)
		lastSent := make([]time.Time, len(reps))
		lastChanges := make([]uint64, len(reps))
		var exchange func()
		exchange = func() {
			now := clock.Now()
			for si, sender := range reps {
				c := sender.rt.Changes()
				if c == lastChanges[si] || (!lastSent[si].IsZero() && now.Sub(lastSent[si]) < iv) {
					continue
				}
				lastChanges[si], lastSent[si] = c, now
				local := sender.rt.LocalBookings(16384)
				for ri, rcv := range reps {
					if ri == si {
						continue
					}
					if o.ExchangeDelay > 0 {
						clock.After(o.ExchangeDelay, func() { rcv.apply(si, local) })
					} else {
						rcv.apply(si, local)
					}
				}
			}
			if remaining > 0 {
				clock.After(poll, exchange)
			}
		}
		exchange()
		if o.ExchangeSync {
			syncEx = func(si int) {
				lastChanges[si], lastSent[si] = reps[si].rt.Changes(), clock.Now()
				local := reps[si].rt.LocalBookings(16384)
				for ri, rcv := range reps {
					if ri != si {
						rcv.apply(si, local)
					}
				}
			}
		}
	}
	clock.Run()
	return results, nil
}

// replicaState is one kvroute replica of a virtual run.
type replicaState struct {
	reg    *workers.Registry
	ix     *kvindex.Index
	feeder IndexFeeder
	rt     *router.Router
	from   map[int]map[string]*peerImport // by sender replica, by worker
}

// peerImport is what one peer reported for one worker: its bookings, and the keys it is
// prefilling there with the speculative entries booked for them (peers.KeyImport, the
// receiver's own bookkeeping).
type peerImport struct {
	booked              scoring.Booked
	firstTokens, finish []time.Time
	writes              router.PeerWrites
	peers.KeyImport
}

// apply replaces what r held from replica si with its summary local, as package
// peers' receiver does (Manager.apply): bookings summed per worker over peers; the
// keys through peers.KeyImport.Update; a worker no longer reported is forgotten.
func (r *replicaState) apply(si int, local []router.WorkerBookings) {
	prev := r.from[si]
	m := make(map[string]*peerImport, len(local))
	for _, l := range local {
		im := prev[l.Worker]
		if im == nil {
			im = &peerImport{}
		}
		im.booked, im.firstTokens, im.finish = l.Booked, l.FirstTokens, l.Finished
		im.writes = router.PeerWrites{Tokens: l.Writes, At: l.WritesAt}
		im.Update(r.ix, l.Worker, l.Keys)
		m[l.Worker] = im
	}
	r.from[si] = m
	sum := map[string]router.PeerWorker{}
	for _, per := range r.from {
		for w, im := range per {
			b := sum[w]
			b.Add(im.booked, im.firstTokens, im.finish, im.writes, im.Reported())
			sum[w] = b
		}
	}
	r.rt.SetPeerBookings(sum)
}

// fanFeeder applies every batch to each replica's index (each replica subscribes to
// every worker's publisher).
type fanFeeder []IndexFeeder

func (f fanFeeder) Apply(worker string, b sim.Batch) {
	for _, x := range f {
		x.Apply(worker, b)
	}
}

func multiFeeder(reps []*replicaState) IndexFeeder {
	if len(reps) == 1 {
		return reps[0].feeder
	}
	f := make(fanFeeder, len(reps))
	for i, r := range reps {
		f[i] = r.feeder
	}
	return f
}

// queueLimits are a virtual run's per-class queue limits, filled as classes appear.
type queueLimits = map[string]int
