package sim

import (
	"testing"
	"time"
)

// pdProfile reads remote KV at 16 ms per block: 1,000 bytes per token, 1 MB/s.
func pdProfile() Profile {
	p := testProfile()
	p.KVBytesPerToken, p.KVTransferBytesPerSecond = 1000, 1e6
	return p
}

func TestTransferTimeIsLatencyPlusBytesOverBandwidth(t *testing.T) {
	p := pdProfile()
	p.KVTransferLatency = 2 * time.Millisecond
	if got, want := p.TransferTime(3), 2*time.Millisecond+48*time.Millisecond; got != want {
		t.Fatalf("TransferTime(3) = %v, want latency + 3 × 16 tokens × 1000 B ÷ 1 MB/s = %v", got, want)
	}
	p.KVTransferBytesPerSecond = 0
	if got := p.TransferTime(3); got != 2*time.Millisecond {
		t.Fatalf("without a bandwidth TransferTime = %v, want the latency alone", got)
	}
	p.KVTransferLatency = -1
	if _, err := NewEngine(p, 1); err == nil {
		t.Fatal("a negative transfer latency must be refused")
	}
}

// A do_remote_decode request keeps its blocks when it finishes (NixlConnector
// request_finished: delay_free_blocks) until the decode engine has read them.
func TestPrefillForRemoteDecodeHoldsBlocksUntilReleased(t *testing.T) {
	e := mustEngine(t, pdProfile())
	r := &Request{ID: "p", Prompt: seqTokens(1, 40), MaxTokens: 1, RemoteDecode: true}
	if err := e.Add(r); err != nil {
		t.Fatal(err)
	}
	outs, _, _ := drain(t, e)
	if len(outs) != 1 || !outs[0].Finished || len(outs[0].HeldBlocks) != 3 {
		t.Fatalf("outputs %+v, want one finished output holding the 3 blocks of 41 tokens", outs)
	}
	if s := e.Stats(); s.HeldRequests != 1 || s.FreeBlocks != 64-3 {
		t.Fatalf("held %d, free %d: want 1 request holding 3 of 64 blocks", s.HeldRequests, s.FreeBlocks)
	}
	if !e.Idle() {
		t.Fatal("held blocks must not keep the engine busy")
	}
	if !e.Release(r) || e.Release(r) {
		t.Fatal("Release must free the held blocks once")
	}
	if s := e.Stats(); s.HeldRequests != 0 || s.FreeBlocks != 64 {
		t.Fatalf("after Release: held %d, free %d", s.HeldRequests, s.FreeBlocks)
	}
	// The prompt's full blocks stay in the prefix cache like any other request's.
	if hit := e.prefixHit(&seq{req: &Request{}, tokens: seqTokens(1, 40)}); len(hit) != 2 {
		t.Fatalf("prefix hit %d blocks after release, want 2", len(hit))
	}
}

// A do_remote_prefill request reads the blocks it lacks for TransferTime outside the
// steps, caches them with every prompt token but the last computed, and then computes
// one token (vllm/v1/core/sched/scheduler.py _update_waiting_for_remote_kv).
func TestDecodeAfterRemotePrefillReadsInsteadOfPrefilling(t *testing.T) {
	e := mustEngine(t, pdProfile())
	// The first 32 tokens are cached locally: only the third block is read.
	if err := e.Add(&Request{ID: "warm", Prompt: seqTokens(1, 33), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	drain(t, e)
	r := &Request{ID: "d", Prompt: seqTokens(1, 40), MaxTokens: 2, RemoteBlocks: 3}
	if err := e.Add(r); err != nil {
		t.Fatal(err)
	}
	if _, outs, _, ok := e.Step(); ok || len(outs) != 0 {
		t.Fatal("while its KV is read the request must not be scheduled")
	}
	if s := e.Stats(); s.Waiting != 1 || s.Running != 0 || e.Idle() {
		t.Fatalf("reading: waiting %d running %d idle %v; want it counted waiting", s.Waiting, s.Running, e.Idle())
	}
	if d, ok := e.NextLoad(); !ok || d != 16*time.Millisecond {
		t.Fatalf("NextLoad = %v %v, want 16ms (one block)", d, ok)
	}
	e.Elapse(15 * time.Millisecond)
	if _, ok := e.NextLoad(); !ok {
		t.Fatal("read ended early")
	}
	e.Elapse(time.Millisecond)
	if _, ok := e.NextLoad(); ok {
		t.Fatal("read did not end after its transfer time")
	}
	d, outs, evs, ok := e.Step()
	if !ok || len(outs) != 1 || !outs[0].First {
		t.Fatalf("after the read: ok %v outputs %+v, want the first token", ok, outs)
	}
	if want := 10*time.Millisecond + 100*time.Microsecond; d != want {
		t.Fatalf("step %v, want one prompt token's step %v", d, want)
	}
	if o := outs[0]; o.CachedTokens != 39 || o.RemoteTokens != 7 {
		t.Fatalf("cached %d remote %d, want 39 (32 local + 7 read) and 7", o.CachedTokens, o.RemoteTokens)
	}
	if len(evs) != 0 {
		// The read third block is partial (tokens 32..39): no BlockStored.
		t.Fatalf("events %+v, want none for a partial block", evs)
	}
	if got := e.Stats().KVTransferTokens; got != 7 {
		t.Fatalf("KVTransferTokens %d, want 7", got)
	}
	outs, _, _ = drain(t, e)
	if len(outs) != 1 || !outs[0].Finished {
		t.Fatalf("decode outputs %+v", outs)
	}
}

// The blocks a decode engine reads enter its prefix cache and are announced as
// BlockStored, so a router's index learns the decode worker now holds them.
func TestRemotePrefillAnnouncesReadBlocks(t *testing.T) {
	e := mustEngine(t, pdProfile())
	r := &Request{ID: "d", Prompt: seqTokens(1, 40), MaxTokens: 1, RemoteBlocks: 3}
	if err := e.Add(r); err != nil {
		t.Fatal(err)
	}
	e.Step()
	e.Elapse(time.Hour)
	_, outs, evs, _ := e.Step()
	if len(evs) != 1 || evs[0].Kind != BlockStored || len(evs[0].Hashes) != 2 || evs[0].HasParent {
		t.Fatalf("events %+v, want one BlockStored of the 2 full prompt blocks", evs)
	}
	if outs[0].RemoteTokens != 39 || outs[0].CachedTokens != 39 {
		t.Fatalf("remote %d cached %d, want 39 (all but the last token)", outs[0].RemoteTokens, outs[0].CachedTokens)
	}
}

func TestAbortDuringRemoteReadFreesBlocks(t *testing.T) {
	e := mustEngine(t, pdProfile())
	r := &Request{ID: "d", Prompt: seqTokens(1, 40), MaxTokens: 4, RemoteBlocks: 3}
	_ = e.Add(r)
	e.Step()
	if e.Stats().FreeBlocks != 61 {
		t.Fatalf("free %d while reading, want 61", e.Stats().FreeBlocks)
	}
	if !e.Abort(r) || e.Stats().FreeBlocks != 64 || !e.Idle() {
		t.Fatalf("abort: free %d idle %v", e.Stats().FreeBlocks, e.Idle())
	}
	held := &Request{ID: "p", Prompt: seqTokens(1, 8), MaxTokens: 1, RemoteDecode: true}
	_ = e.Add(held)
	drain(t, e)
	if !e.Abort(held) || e.Stats().HeldRequests != 0 || e.Stats().FreeBlocks != 64 {
		t.Fatal("aborting a held prefill must free its blocks")
	}
}

// In virtual time the read overlaps other work: a request arriving while another's KV
// is read is served at once, and the read one starts when its transfer ends.
func TestVirtualEngineServesOthersDuringARemoteRead(t *testing.T) {
	start := time.Unix(1000, 0)
	clock := NewClock(start)
	first := map[string]time.Duration{}
	v := NewVirtualEngine(mustEngine(t, pdProfile()), clock, func(o Output) {
		if o.First {
			first[o.Req.ID] = clock.Now().Sub(start)
		}
	}, nil)
	if err := v.Submit(&Request{ID: "d", Prompt: seqTokens(1, 40), MaxTokens: 1, RemoteBlocks: 3}); err != nil {
		t.Fatal(err)
	}
	clock.After(5*time.Millisecond, func() { _ = v.Submit(&Request{ID: "n", Prompt: seqTokens(500, 8), MaxTokens: 1}) })
	clock.Run()
	step1 := 10*time.Millisecond + 100*time.Microsecond
	if got, want := first["n"], 5*time.Millisecond+10*time.Millisecond+800*time.Microsecond; got != want {
		t.Fatalf("other request's first token at %v, want %v (not delayed by the read)", got, want)
	}
	if got, want := first["d"], 48*time.Millisecond+step1; got != want {
		t.Fatalf("remote request's first token at %v, want read 48ms + one-token step = %v", got, want)
	}
}
