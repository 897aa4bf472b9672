package sim

import (
	"errors"
	"math"
	"testing"
	"time"
)

// testProfile is small and round: 10 ms per step, 100 µs per prefill token, 1 ms per
// decoding sequence, 16-token blocks.
func testProfile() Profile {
	return Profile{Name: "test", Model: "m", StepOverhead: 10 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
		DecodePerSeq: time.Millisecond, BlockSize: 16, NumBlocks: 64, MaxNumSeqs: 8, MaxBatchTokens: 64}
}

func seqTokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// drain steps until idle, returning outputs and events in order and the total time.
func drain(t *testing.T, e *Engine) (outs []Output, evs []Event, total time.Duration) {
	t.Helper()
	for i := 0; i < 100000; i++ {
		d, o, ev, ok := e.Step()
		if !ok {
			return
		}
		total += d
		outs = append(outs, o...)
		evs = append(evs, ev...)
	}
	t.Fatal("engine never went idle")
	return
}

func mustEngine(t *testing.T, p Profile) *Engine {
	t.Helper()
	e, err := NewEngine(p, 42)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestMaxNumSeqsBoundsTheBatch(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 2
	e := mustEngine(t, p)
	for i := 0; i < 3; i++ {
		if err := e.Add(&Request{ID: string(rune('a' + i)), Prompt: seqTokens(i*100, 8), MaxTokens: 4}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, ok := e.Step(); !ok {
		t.Fatal("no step")
	}
	if s := e.Stats(); s.Running != 2 || s.Waiting != 1 {
		t.Fatalf("running %d waiting %d, want 2 and 1", s.Running, s.Waiting)
	}
	outs, _, _ := drain(t, e)
	fin := 0
	for _, o := range outs {
		if o.Finished {
			fin++
			if o.Generated != 4 {
				t.Errorf("%s generated %d, want 4", o.Req.ID, o.Generated)
			}
		}
	}
	if fin != 3 {
		t.Fatalf("finished %d, want 3", fin)
	}
}

func TestChunkedPrefillStepsEventsAndTiming(t *testing.T) {
	p := testProfile()
	e := mustEngine(t, p)
	if err := e.Add(&Request{ID: "r", Prompt: seqTokens(1000, 200), MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	// 200 prompt tokens under a 64-token budget: chunks 64, 64, 64, 8.
	var stored []Event
	for i, want := range []int{64, 64, 64, 8} {
		d, outs, evs, ok := e.Step()
		if !ok {
			t.Fatalf("step %d: idle", i)
		}
		if wantD := p.StepTime(want, 0); d != wantD {
			t.Errorf("step %d: %v, want %v", i, d, wantD)
		}
		if first := len(outs) == 1 && outs[0].First; first != (i == 3) {
			t.Errorf("step %d: first token %v", i, first)
		}
		for _, ev := range evs {
			if ev.Kind == BlockStored {
				stored = append(stored, ev)
			}
		}
	}
	// Full blocks after each chunk: 4, 8, 12, 12 (200/16 = 12 full blocks).
	if len(stored) != 3 {
		t.Fatalf("%d BlockStored events, want 3 (one per chunk that filled blocks)", len(stored))
	}
	for i, ev := range stored {
		if len(ev.Hashes) != 4 || len(ev.Tokens) != 64 || ev.BlockSize != 16 {
			t.Fatalf("event %d: %d hashes %d tokens", i, len(ev.Hashes), len(ev.Tokens))
		}
		if ev.Tokens[0] != uint32(1000+64*i) {
			t.Errorf("event %d starts at token %d", i, ev.Tokens[0])
		}
		if i == 0 && ev.HasParent {
			t.Error("first chunk has a parent")
		}
		if i > 0 && (!ev.HasParent || ev.Parent != stored[i-1].Hashes[3]) {
			t.Errorf("chunk %d parent %x, want previous chunk's last block %x", i, ev.Parent, stored[i-1].Hashes[3])
		}
	}
	// Decode step: 1 sequence.
	d, outs, _, _ := e.Step()
	if d != p.StepTime(0, 1) || len(outs) != 1 || !outs[0].Finished {
		t.Fatalf("decode step %v outs %+v", d, outs)
	}
}

func TestPrefixHitIsBlockAlignedAndBelowPromptLength(t *testing.T) {
	e := mustEngine(t, testProfile())
	run := func(id string, prompt []uint32) (Output, []Event) {
		t.Helper()
		if err := e.Add(&Request{ID: id, Prompt: prompt, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		outs, evs, _ := drain(t, e)
		return outs[len(outs)-1], evs
	}
	run("a", seqTokens(0, 32))
	// The identical 32-token prompt: at most 31 tokens may hit → 1 block.
	o, evs := run("b", seqTokens(0, 32))
	if o.CachedTokens != 16 {
		t.Errorf("identical prompt cached %d, want 16", o.CachedTokens)
	}
	// Recomputing block 1 of an identical prompt stores it again (same hash).
	if len(evs) != 1 || len(evs[0].Hashes) != 1 || !evs[0].HasParent {
		t.Errorf("events %+v, want one BlockStored of block 1 with its parent", evs)
	}
	// 40 tokens sharing the first 32: 2 blocks hit, 32 tokens.
	o, _ = run("c", seqTokens(0, 40))
	if o.CachedTokens != 32 {
		t.Errorf("extended prompt cached %d, want 32", o.CachedTokens)
	}
	// A prompt differing in token 20: only block 0 hits.
	p := seqTokens(0, 40)
	p[20] = 99999
	o, _ = run("d", p)
	if o.CachedTokens != 16 {
		t.Errorf("diverging prompt cached %d, want 16", o.CachedTokens)
	}
	s := e.Stats()
	if s.PrefixQueries != 32+32+40+40 || s.PrefixHits != 16+32+16 {
		t.Errorf("queries %d hits %d", s.PrefixQueries, s.PrefixHits)
	}
}

func TestLRUEvictionEmitsBlockRemovedOldestFirst(t *testing.T) {
	p := testProfile()
	p.NumBlocks = 6
	e := mustEngine(t, p)
	hashesOf := func(evs []Event) (st, rm []uint64) {
		for _, ev := range evs {
			switch ev.Kind {
			case BlockStored:
				st = append(st, ev.Hashes...)
			case BlockRemoved:
				rm = append(rm, ev.Hashes...)
			}
		}
		return
	}
	// A and B each hold 2 full prompt blocks (+1 block for the generated token).
	for _, id := range []string{"A", "B"} {
		if err := e.Add(&Request{ID: id, Prompt: seqTokens(len(id)*int(id[0])*1000, 32), MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, evs, _ := drain(t, e)
	st, rm := hashesOf(evs)
	if len(st) != 4 || len(rm) != 0 {
		t.Fatalf("stored %d removed %d", len(st), len(rm))
	}
	a, b := st[:2], st[2:]
	if err := e.Add(&Request{ID: "C", Prompt: seqTokens(500000, 40), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	_, evs, _ = drain(t, e)
	_, rm = hashesOf(evs)
	// C needs 3 blocks: 2 free ones first, then the least recently freed cached block.
	// A finished first; its tail block (freed first) is evicted first.
	if len(rm) != 1 || rm[0] != a[1] {
		t.Fatalf("removed %x, want A's tail block %x (A=%x B=%x)", rm, a[1], a, b)
	}
	// A's head block is still cached: a hit of 16 tokens.
	if err := e.Add(&Request{ID: "A2", Prompt: seqTokens(1*int('A')*1000, 32), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	outs, _, _ := drain(t, e)
	if outs[0].CachedTokens != 16 {
		t.Errorf("A again cached %d, want 16", outs[0].CachedTokens)
	}
}

func TestPreemptionWhenCacheIsFullNeverFails(t *testing.T) {
	p := testProfile()
	p.NumBlocks = 8 // 128 tokens
	e := mustEngine(t, p)
	// Each request grows to 40 + 60 = 100 tokens = 7 blocks: two cannot run together.
	for _, id := range []string{"x", "y"} {
		if err := e.Add(&Request{ID: id, Prompt: seqTokens(int(id[0])*1000, 40), MaxTokens: 60}); err != nil {
			t.Fatal(err)
		}
	}
	outs, _, _ := drain(t, e)
	done := map[string]int{}
	for _, o := range outs {
		if o.Finished {
			done[o.Req.ID] = o.Generated
		}
	}
	if done["x"] != 60 || done["y"] != 60 {
		t.Fatalf("finished %v", done)
	}
	if e.Stats().Preemptions == 0 {
		t.Error("no preemption although the cache could not hold both")
	}
	if s := e.Stats(); s.FreeBlocks != 8 {
		t.Errorf("free blocks %d after drain, want 8", s.FreeBlocks)
	}
}

func TestQueueingWhenPromptsDoNotFit(t *testing.T) {
	p := testProfile()
	p.NumBlocks = 8
	p.MaxBatchTokens = 256
	e := mustEngine(t, p)
	_ = e.Add(&Request{ID: "big", Prompt: seqTokens(0, 100), MaxTokens: 2})
	_ = e.Add(&Request{ID: "next", Prompt: seqTokens(5000, 60), MaxTokens: 2})
	e.Step()
	if s := e.Stats(); s.Running != 1 || s.Waiting != 1 {
		t.Fatalf("running %d waiting %d: the second prompt must wait for blocks", s.Running, s.Waiting)
	}
	outs, _, _ := drain(t, e)
	if n := len(outs); n != 3 { // big's first token came from the step above
		t.Fatalf("%d outputs", n)
	}
	if err := e.Add(&Request{ID: "huge", Prompt: seqTokens(0, 200), MaxTokens: 1}); !errors.Is(err, ErrTooLong) {
		t.Fatalf("too long prompt: %v", err)
	}
	if err := e.Add(&Request{ID: "empty", MaxTokens: 1}); !errors.Is(err, ErrEmptyPrompt) {
		t.Fatalf("empty prompt: %v", err)
	}
}

func TestGeneratedBlocksAreStoredWithTheirParent(t *testing.T) {
	e := mustEngine(t, testProfile())
	_ = e.Add(&Request{ID: "g", Prompt: seqTokens(0, 16), MaxTokens: 20})
	outs, evs, _ := drain(t, e)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2 (prompt block, then the block filled by generated tokens)", len(evs))
	}
	gen := evs[1]
	if !gen.HasParent || gen.Parent != evs[0].Hashes[0] {
		t.Fatalf("generated block parent %x, want %x", gen.Parent, evs[0].Hashes[0])
	}
	for i, tok := range gen.Tokens {
		if tok != outs[i].Token {
			t.Fatalf("generated block token %d = %d, want sampled %d", i, tok, outs[i].Token)
		}
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := mustEngine(t, testProfile())
	_ = e.Add(&Request{ID: "a", Prompt: seqTokens(0, 32), MaxTokens: 3})
	e.Step()
	if e.ResetPrefixCache() {
		t.Fatal("reset succeeded while a request holds blocks")
	}
	drain(t, e)
	if !e.ResetPrefixCache() {
		t.Fatal("reset failed when idle")
	}
	evs := e.TakeEvents()
	if len(evs) != 1 || evs[0].Kind != AllBlocksCleared {
		t.Fatalf("events %+v", evs)
	}
	_ = e.Add(&Request{ID: "b", Prompt: seqTokens(0, 32), MaxTokens: 1})
	outs, _, _ := drain(t, e)
	if outs[0].CachedTokens != 0 {
		t.Errorf("cached %d after reset", outs[0].CachedTokens)
	}
}

func TestEngineHashesDependOnSeed(t *testing.T) {
	first := func(seed uint64) uint64 {
		e, _ := NewEngine(testProfile(), seed)
		_ = e.Add(&Request{ID: "a", Prompt: seqTokens(0, 17), MaxTokens: 1})
		_, evs, _ := drain(t, e)
		return evs[0].Hashes[0]
	}
	if first(1) != first(1) {
		t.Error("same seed, different hashes")
	}
	if first(1) == first(2) {
		t.Error("different seeds, same hash")
	}
}

func TestProfilesMatchTheirDocumentedSpeeds(t *testing.T) {
	l := Profiles["l40s-27b"]
	if r := l.PrefillTokensPerSecond(); r < 2500 || r > 3500 {
		t.Errorf("l40s-27b prefill %.0f tok/s, want ~3000", r)
	}
	if r := l.DecodeTokensPerSecond(); r < 25 || r > 35 {
		t.Errorf("l40s-27b decode %.1f tok/s, want ~30", r)
	}
	h := Profiles["h100-8b"]
	if h.PrefillTokensPerSecond() < 3*l.PrefillTokensPerSecond() || h.DecodeTokensPerSecond() < 100 {
		t.Errorf("h100-8b prefill %.0f decode %.0f", h.PrefillTokensPerSecond(), h.DecodeTokensPerSecond())
	}
	if _, err := LookupProfile("nope"); err == nil {
		t.Error("unknown profile accepted")
	}
}

func TestSetSpeedDividesStepTime(t *testing.T) {
	p := Profile{Name: "t", Model: "m", StepOverhead: 10 * time.Millisecond, PrefillPerToken: time.Millisecond, BlockSize: 16,
		NumBlocks: 64, MaxNumSeqs: 4, MaxBatchTokens: 256}
	e, err := NewEngine(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{0, -1, math.NaN()} {
		if e.SetSpeed(bad) == nil {
			t.Errorf("SetSpeed(%v) accepted", bad)
		}
	}
	if e.Speed() != 1 {
		t.Fatalf("default speed %v", e.Speed())
	}
	if err := e.SetSpeed(4); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(&Request{ID: "a", Prompt: make([]uint32, 100), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	d, _, _, ok := e.Step()
	if want := (10*time.Millisecond + 100*time.Millisecond) / 4; !ok || d != want {
		t.Errorf("step at speed 4 = %v, want %v", d, want)
	}
}
