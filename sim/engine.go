package sim

import (
	"errors"
	"fmt"
	"time"
)

// ErrTooLong is returned by Add for a request that could never fit in the KV cache
// (vLLM rejects such prompts with HTTP 400 at input validation).
var ErrTooLong = errors.New("sim: prompt plus max_tokens exceed the KV cache capacity")

// ErrEmptyPrompt is returned by Add for a request without prompt tokens.
var ErrEmptyPrompt = errors.New("sim: empty prompt")

// Request is one generation request. The engine generates exactly MaxTokens tokens
// (ignore_eos behaviour).
type Request struct {
	ID        string
	Prompt    []uint32
	MaxTokens int
	CacheSalt string // vLLM cache_salt: separates prefix caches
	LoRA      string // LoRA adapter name ("" for the base model): in every block's hash, one of Profile.MaxLoRAs slots
	// RemoteDecode marks a prefill for a remote decode engine (NixlConnector
	// do_remote_decode, pd.go): when it finishes, its blocks are held, not freed, until
	// Release.
	RemoteDecode bool
	// RemoteBlocks > 0 marks a decode after a remote prefill (do_remote_prefill, pd.go):
	// the KV of the prompt's first RemoteBlocks blocks (len(remote_block_ids)) is read
	// from the prefill engine instead of computed.
	RemoteBlocks int
	// Tag is opaque to the engine; drivers use it to find their own state.
	Tag any
}

// Output is what one step produced for one request.
type Output struct {
	Req          *Request
	Token        uint32 // the token sampled in this step (when Sampled)
	Sampled      bool
	First        bool // Token is the first generated token
	Finished     bool // the request generated MaxTokens tokens and left the engine
	Generated    int  // tokens generated so far
	CachedTokens int  // prefix-cache hit at first scheduling, tokens (usage cached_tokens)
	LoRALoaded   bool // the request's adapter was loaded for it (a slot miss), on its first output
	// RemoteTokens are the prompt tokens whose KV was read from a remote prefill engine
	// (included in CachedTokens), on every output.
	RemoteTokens int
	// HeldBlocks are the block ids a finished RemoteDecode request holds for the remote
	// decode engine (NixlConnector remote_block_ids), on its Finished output.
	HeldBlocks []int32
}

// Stats is the engine's own view of itself (what /metrics exports).
type Stats struct {
	Running, Waiting int
	KVUsage          float64 // fraction of blocks referenced by requests
	PrefixQueries    uint64  // prompt tokens looked up in the prefix cache
	PrefixHits       uint64  // of which hit
	Preemptions      uint64
	Steps            uint64
	FreeBlocks       int
	// LoRA (lora.go): the distinct adapters of running and of waiting requests, as vLLM's
	// vllm:lora_requests_info lists them, and the adapter loads so far.
	RunningLoRAs, WaitingLoRAs []string
	LoRALoads                  uint64
	// P/D (pd.go): prompt tokens read from remote prefill engines, and finished prefill
	// requests holding their blocks for a remote decode engine. Waiting includes the
	// requests reading KV.
	KVTransferTokens uint64
	HeldRequests     int
}

type seq struct {
	req       *Request
	tokens    []uint32 // prompt followed by generated tokens
	promptLen int
	blocks    []int32  // KV blocks, one per BlockSize tokens (last may be partial)
	hashes    []uint64 // engine hashes of the full blocks of tokens
	committed int      // leading blocks already in the prefix cache
	computed  int      // tokens whose KV is computed
	generated int
	cached    int  // prefix hit at first scheduling
	admitted  bool // scheduled at least once
	loaded    bool // its adapter was loaded for it
	// remote prefill (pd.go): KV read up to token loadTo, loadLeft to go; remote tokens
	// read; the read is over (remoteDone) and its blocks wait to be scheduled (loadDone).
	loadTo               int
	loadLeft             time.Duration
	remote               int
	remoteDone, loadDone bool
}

// Engine is the state machine of one vLLM engine core: requests wait, are scheduled
// into steps, and produce tokens. It has no clock: a driver calls Step, waits the
// returned duration (really or virtually), then delivers the outputs and events.
// Not safe for concurrent use; drivers serialize access.
type Engine struct {
	prof    Profile
	seed    uint64
	pool    *blockPool
	waiting []*seq
	running []*seq
	stats   Stats
	// speed divides every step's duration (1: the profile's speed; 2: twice as fast;
	// 1/3: three times slower). 0 means 1.
	speed float64
	slots []string // LoRA adapters held in GPU slots, least recently used first (lora.go)
	// P/D (pd.go): requests reading KV from a remote prefill engine, and finished prefill
	// requests' blocks held for a remote decode engine.
	loading []*seq
	held    map[*Request][]int32
}

// SetSpeed makes every later step take the profile's step time ÷ f: a worker f times
// faster (f > 1) or slower (f < 1) than its profile, e.g. another GPU model in the same
// pool or a throttled one. Steps already returned keep their duration. f must be > 0.
func (e *Engine) SetSpeed(f float64) error {
	if !(f > 0) || f > 1e6 {
		return fmt.Errorf("sim: speed factor %v: must be positive", f)
	}
	e.speed = f
	return nil
}

// Speed returns the factor set by SetSpeed (1 if none).
func (e *Engine) Speed() float64 {
	if e.speed == 0 {
		return 1
	}
	return e.speed
}

// NewEngine returns an idle engine. seed is the engine's block-hash seed (vLLM's
// NONE_HASH): workers with different seeds produce different hashes for equal blocks.
func NewEngine(p Profile, seed uint64) (*Engine, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &Engine{prof: p, seed: seed, pool: newBlockPool(p.NumBlocks)}, nil
}

// Profile returns the engine's profile.
func (e *Engine) Profile() Profile { return e.prof }

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.prof.BlockSize - 1) / e.prof.BlockSize
}

// Check returns the error Add would return for r (ErrEmptyPrompt, ErrTooLong), without
// queueing it; drivers that delay Add by the profile's RequestOverhead check first.
func (e *Engine) Check(r *Request) error {
	if len(r.Prompt) == 0 {
		return ErrEmptyPrompt
	}
	if e.blocksFor(len(r.Prompt)+max(r.MaxTokens, 1)) > e.prof.NumBlocks {
		return ErrTooLong
	}
	if r.LoRA != "" && e.prof.MaxLoRAs <= 0 {
		return ErrNoLoRA
	}
	return nil
}

// Add queues a request.
func (e *Engine) Add(r *Request) error {
	if err := e.Check(r); err != nil {
		return err
	}
	if r.MaxTokens < 1 {
		r.MaxTokens = 1
	}
	s := &seq{req: r, tokens: append(make([]uint32, 0, len(r.Prompt)+r.MaxTokens), r.Prompt...), promptLen: len(r.Prompt)}
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort removes a request wherever it is and frees its blocks. It reports whether the
// request was found.
func (e *Engine) Abort(r *Request) bool {
	for i, s := range e.running {
		if s.req == r {
			e.pool.release(s.blocks)
			e.running = append(e.running[:i], e.running[i+1:]...)
			return true
		}
	}
	for i, s := range e.waiting {
		if s.req == r {
			e.pool.release(s.blocks)
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return true
		}
	}
	return e.abortRemote(r)
}

// Idle reports whether no request is waiting or running.
// Requests reading remote KV count as waiting; held blocks do not keep it busy.
func (e *Engine) Idle() bool {
	return len(e.running) == 0 && len(e.waiting) == 0 && len(e.loading) == 0
}

// Stats returns the current statistics.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running, s.Waiting = len(e.running), len(e.waiting)+len(e.loading)
	s.HeldRequests = len(e.held)
	s.KVUsage = e.pool.usage()
	s.FreeBlocks = e.pool.free()
	s.RunningLoRAs, s.WaitingLoRAs = adaptersOf(e.running), adaptersOf(e.waiting)
	return s
}

// ResetPrefixCache drops every cached block (AllBlocksCleared). Like vLLM it refuses
// while requests hold blocks, and reports whether it reset.
func (e *Engine) ResetPrefixCache() bool { return e.pool.reset() }

// TakeEvents returns and clears the events not yet returned by Step (e.g. after
// ResetPrefixCache).
func (e *Engine) TakeEvents() []Event {
	ev := e.pool.events
	e.pool.events = nil
	return ev
}

// extendHashes computes engine hashes for every full block of s.tokens.
func (e *Engine) extendHashes(s *seq) {
	bs := e.prof.BlockSize
	for len(s.hashes) < len(s.tokens)/bs {
		i := len(s.hashes)
		var parent uint64
		if i > 0 {
			parent = s.hashes[i-1]
		}
		salt := ""
		if i == 0 {
			salt = s.req.CacheSalt
		}
		if s.req.LoRA != "" {
			salt = "lora\x00" + s.req.LoRA + "\x00" + salt // the adapter is in every block's hash
		}
		s.hashes = append(s.hashes, blockHash(e.seed, parent, salt, s.tokens[i*bs:(i+1)*bs]))
	}
}

// prefixHit returns the cached leading blocks of s, block aligned and covering at
// most len(tokens)−1 tokens (vLLM always recomputes the last token).
func (e *Engine) prefixHit(s *seq) []int32 {
	e.extendHashes(s)
	maxBlocks := (len(s.tokens) - 1) / e.prof.BlockSize
	var hit []int32
	for i := 0; i < maxBlocks && i < len(s.hashes); i++ {
		id, ok := e.pool.lookup(s.hashes[i])
		if !ok {
			break
		}
		hit = append(hit, id)
	}
	return hit
}

type scheduled struct {
	s *seq
	n int
}

// Step schedules one engine iteration and applies its effects. It returns the step's
// duration, the outputs to deliver when the step ends, and the KV events of the step
// (one vLLM event batch). ok is false when there was nothing to run.
func (e *Engine) Step() (d time.Duration, outs []Output, events []Event, ok bool) {
	budget := e.prof.MaxBatchTokens
	var sched []scheduled
	preempted := false
	var work StepWork
	// 1. running requests, in order (vllm/v1/core/sched/scheduler.py).
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(len(s.tokens)-s.computed, budget)
		need := e.blocksFor(s.computed+n) - len(s.blocks)
		self := false
		for need > e.pool.free() {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				self = true
				break
			}
		}
		if self {
			break
		}
		if need > 0 {
			s.blocks = e.pool.alloc(need, s.blocks)
		}
		sched = append(sched, scheduled{s, n})
		budget -= n
	}
	// 2. waiting requests, FCFS, unless this step preempted. A request whose adapter
	// would be one too many for the step is skipped, not blocking those behind it.
	var loads int
	for wi := 0; !preempted && wi < len(e.waiting) && len(e.running) < e.prof.MaxNumSeqs && budget > 0; {
		s := e.waiting[wi]
		if !e.loraFits(s.req.LoRA) {
			wi++
			continue
		}
		if s.loadDone { // its remote KV arrived: blocks held, the last prompt token to compute
			e.waiting = append(e.waiting[:wi], e.waiting[wi+1:]...)
			s.loadDone = false
			if e.useLoRA(s.req.LoRA) {
				loads++
				s.loaded = true
			}
			n := min(len(s.tokens)-s.computed, budget)
			e.running = append(e.running, s)
			sched = append(sched, scheduled{s, n})
			budget -= n
			continue
		}
		if s.req.RemoteBlocks > 0 && !s.remoteDone {
			loading, blocked := e.startLoad(s)
			if blocked {
				break // queue: wait for blocks to be freed
			}
			if loading {
				e.waiting = append(e.waiting[:wi], e.waiting[wi+1:]...)
				continue
			}
		}
		hit := e.prefixHit(s)
		hitTokens := len(hit) * e.prof.BlockSize
		n := min(len(s.tokens)-hitTokens, budget)
		need := e.blocksFor(hitTokens+n) - len(hit)
		pinned := 0
		for _, id := range hit {
			if e.pool.blocks[id].ref == 0 {
				pinned++
			}
		}
		if need+pinned > e.pool.free() {
			break // queue: wait for blocks to be freed
		}
		e.waiting = append(e.waiting[:wi], e.waiting[wi+1:]...)
		if e.useLoRA(s.req.LoRA) {
			loads++
			s.loaded = true
		}
		for _, id := range hit {
			e.pool.touch(id)
		}
		s.blocks = append(s.blocks[:0], hit...)
		s.blocks = e.pool.alloc(need, s.blocks)
		s.computed, s.committed = hitTokens, len(hit)
		e.stats.PrefixQueries += uint64(len(s.tokens))
		e.stats.PrefixHits += uint64(hitTokens)
		if !s.admitted {
			s.admitted, s.cached = true, hitTokens
		}
		e.running = append(e.running, s)
		sched = append(sched, scheduled{s, n})
		budget -= n
	}
	if len(sched) == 0 {
		events = e.TakeEvents()
		return 0, nil, events, len(events) > 0
	}
	// 3. compute: KV of the scheduled tokens is written; full blocks enter the cache.
	for _, sc := range sched {
		s := sc.s
		if s.computed >= s.promptLen {
			work.DecodeSeqs++
			work.DecodeContext += e.prof.EffectiveContext(s.computed + sc.n)
		} else {
			work.PrefillTokens += sc.n
			work.PrefillAttn += e.prof.PrefillAttn(s.computed, sc.n)
		}
		s.computed += sc.n
		e.commit(s)
	}
	e.stats.Steps++
	d = e.prof.StepCost(work) + time.Duration(loads)*e.prof.LoRALoadTime
	if e.speed > 0 && e.speed != 1 {
		d = time.Duration(float64(d) / e.speed)
	}
	// 4. sample: every request whose tokens are all computed gets one new token.
	finished := false
	for _, sc := range sched {
		s := sc.s
		if s.computed < len(s.tokens) {
			continue // chunked prefill in progress
		}
		s.generated++
		tok := genToken(s.req.ID, s.generated)
		s.tokens = append(s.tokens, tok)
		o := Output{Req: s.req, Token: tok, Sampled: true, First: s.generated == 1, Generated: s.generated, CachedTokens: s.cached,
			RemoteTokens: s.remote}
		o.LoRALoaded = o.First && s.loaded
		if s.generated >= s.req.MaxTokens {
			o.Finished = true
			if s.req.RemoteDecode {
				o.HeldBlocks = e.hold(s)
			} else {
				e.pool.release(s.blocks)
			}
			s.blocks = nil
			finished = true
		}
		outs = append(outs, o)
	}
	if finished {
		kept := e.running[:0]
		for _, s := range e.running {
			if s.blocks != nil || s.generated < s.req.MaxTokens {
				kept = append(kept, s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	return d, outs, e.TakeEvents(), true
}

// commit puts s's newly full, computed blocks into the prefix cache and records one
// BlockStored event for them (vLLM cache_full_blocks), parent = the block before.
func (e *Engine) commit(s *seq) {
	bs := e.prof.BlockSize
	full := s.computed / bs
	if full <= s.committed {
		return
	}
	e.extendHashes(s)
	ev := Event{Kind: BlockStored, BlockSize: bs, Medium: e.pool.medium, LoRA: s.req.LoRA,
		Tokens: append([]uint32(nil), s.tokens[s.committed*bs:full*bs]...)}
	if s.committed > 0 {
		ev.HasParent, ev.Parent = true, s.hashes[s.committed-1]
	} else {
		ev.CacheSalt = s.req.CacheSalt
	}
	for i := s.committed; i < full; i++ {
		e.pool.commit(s.blocks[i], s.hashes[i])
		ev.Hashes = append(ev.Hashes, s.hashes[i])
	}
	e.pool.events = append(e.pool.events, ev)
	s.committed = full
}

// preempt frees a running request's blocks and puts it back at the front of the
// waiting queue to be recomputed (vLLM v1 preemption by recomputation).
func (e *Engine) preempt(s *seq) {
	e.pool.release(s.blocks)
	s.blocks, s.computed, s.committed = nil, 0, 0
	s.loadDone = false // recomputed locally, as vLLM does (do_remote_prefill is cleared at the first read)
	e.stats.Preemptions++
	e.waiting = append([]*seq{s}, e.waiting...)
}

// genToken is the deterministic id of the i-th generated token of request id.
func genToken(id string, i int) uint32 {
	h := uint32(2166136261)
	for j := 0; j < len(id); j++ {
		h = (h ^ uint32(id[j])) * 16777619
	}
	h = (h ^ uint32(i)) * 16777619
	h ^= h >> 15
	return 1000 + h%30000
}
