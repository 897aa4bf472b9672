package sim

import (
	"slices"
	"time"
)

// Prefill/decode disaggregation, as vLLM's NixlConnector runs it
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py):
//
//   - A prefill request (Request.RemoteDecode, kv_transfer_params do_remote_decode) runs
//     as usual; when it finishes, its blocks are not freed but held for the decode
//     engine to read (request_finished returns delay_free_blocks), listed in its last
//     Output (HeldBlocks), until Release or an abort.
//   - A decode request (Request.RemoteBlocks > 0, kv_transfer_params do_remote_prefill)
//     is admitted with blocks for its whole prompt; the prompt blocks it does not hold in
//     its own prefix cache (get_unhashed_block_ids) are read from the prefill engine
//     asynchronously, outside the steps (get_num_new_matched_tokens returns load_kv_async),
//     taking Profile.TransferTime. When the read ends, the blocks are cached (BlockStored
//     events, cache_blocks) with every prompt token but the last computed (vllm/v1/core/
//     sched/scheduler.py _update_waiting_for_remote_kv), and the request is scheduled
//     again: one prompt token to compute, then decode.
//
// The engine has no clock: drivers report the time that passes with Elapse, and when a
// step finds nothing to run they wait NextLoad before stepping again.

// TransferTime is how long reading blocks KV blocks from a remote engine takes:
// KVTransferLatency + blocks × BlockSize × KVBytesPerToken ÷ KVTransferBytesPerSecond
// (no bandwidth term when either is zero).
func (p Profile) TransferTime(blocks int) time.Duration {
	d := p.KVTransferLatency
	if p.KVBytesPerToken > 0 && p.KVTransferBytesPerSecond > 0 && blocks > 0 {
		bytes := float64(blocks) * float64(p.BlockSize) * p.KVBytesPerToken
		d += time.Duration(bytes / p.KVTransferBytesPerSecond * 1e9)
	}
	return d
}

// startLoad admits a waiting remote-prefill request: it takes its prefix-cache hit and
// blocks for the whole prompt, and starts reading the rest from the remote engine. It
// reports whether the request left the waiting queue (loading, or needing no read: then
// it is marked done and admitted as usual) and whether it must wait for free blocks.
func (e *Engine) startLoad(s *seq) (loading, blocked bool) {
	hit := e.prefixHit(s)
	all := e.blocksFor(s.promptLen)
	read := min(s.req.RemoteBlocks, all) - len(hit)
	if read <= 0 { // the local cache holds every block the remote engine offers
		s.remoteDone = true
		return false, false
	}
	pinned := 0
	for _, id := range hit {
		if e.pool.blocks[id].ref == 0 {
			pinned++
		}
	}
	if all-len(hit)+pinned > e.pool.free() {
		return false, true
	}
	for _, id := range hit {
		e.pool.touch(id)
	}
	hitTokens := len(hit) * e.prof.BlockSize
	s.blocks = append(s.blocks[:0], hit...)
	s.blocks = e.pool.alloc(all-len(hit), s.blocks)
	s.computed, s.committed = hitTokens, len(hit)
	e.stats.PrefixQueries += uint64(s.promptLen)
	e.stats.PrefixHits += uint64(hitTokens)
	// vLLM caps the computed tokens at the prompt and recomputes the last one.
	s.loadTo = min((len(hit)+read)*e.prof.BlockSize, s.promptLen)
	if s.loadTo == s.promptLen {
		s.loadTo--
	}
	s.loadLeft = e.prof.TransferTime(read)
	s.admitted, s.cached = true, hitTokens
	e.loading = append(e.loading, s)
	return true, false
}

// Elapse tells the engine that d of time passed: remote reads in progress advance, and
// each finished one caches its blocks (its BlockStored event comes with the next step)
// and returns its request to the front of the waiting queue.
func (e *Engine) Elapse(d time.Duration) {
	if len(e.loading) == 0 || d <= 0 {
		return
	}
	kept := e.loading[:0]
	var done []*seq
	for _, s := range e.loading {
		if s.loadLeft -= d; s.loadLeft > 0 {
			kept = append(kept, s)
			continue
		}
		s.remote = s.loadTo - s.computed
		s.computed = s.loadTo
		s.cached = s.loadTo
		e.stats.KVTransferTokens += uint64(s.remote)
		e.commit(s)
		s.remoteDone, s.loadDone = true, true
		done = append(done, s)
	}
	clear(e.loading[len(kept):])
	e.loading = kept
	e.waiting = append(done, e.waiting...)
}

// NextLoad returns the time until the next remote read ends; ok is false when none is
// in progress.
func (e *Engine) NextLoad() (d time.Duration, ok bool) {
	for i, s := range e.loading {
		if i == 0 || s.loadLeft < d {
			d = s.loadLeft
		}
	}
	return max(d, 0), len(e.loading) > 0
}

// hold keeps a finished prefill request's blocks for the remote decode engine and
// returns their ids (NixlConnector remote_block_ids).
func (e *Engine) hold(s *seq) []int32 {
	if e.held == nil {
		e.held = map[*Request][]int32{}
	}
	e.held[s.req] = s.blocks
	return slices.Clone(s.blocks)
}

// Release frees the blocks a finished prefill request (Request.RemoteDecode) holds for
// its remote decode engine: the decode engine read them, or gave up. It reports whether
// r held blocks.
func (e *Engine) Release(r *Request) bool {
	ids, ok := e.held[r]
	if ok {
		delete(e.held, r)
		e.pool.release(ids)
	}
	return ok
}

// abortRemote removes r from the remote reads in progress and from the held requests,
// freeing its blocks; it reports whether r was found.
func (e *Engine) abortRemote(r *Request) bool {
	if e.Release(r) {
		return true
	}
	for i, s := range e.loading {
		if s.req == r {
			e.pool.release(s.blocks)
			e.loading = append(e.loading[:i], e.loading[i+1:]...)
			return true
		}
	}
	return false
}
