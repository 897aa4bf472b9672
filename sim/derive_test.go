package sim

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

func within(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %.6g, want %.6g (±%.1f%%)", what, got, want, 100*rel)
	}
}

// TestDeriveH100Llama8B checks every derived figure of h100-8b against a hand calculation
// from the datasheet and config.json numbers in derive.go.
func TestDeriveH100Llama8B(t *testing.T) {
	d, err := Derive("x", GPUH100, ModelLlama31_8B, VLLM{})
	if err != nil {
		t.Fatal(err)
	}
	within(t, "weights per GPU (B)", d.WeightBytesPerGPU, 8.03e9*2, 1e-9)
	// 2 (K and V) × 32 layers × 8 KV heads × 128 × 2 bytes = 131,072 B.
	within(t, "KV bytes per token", d.KVBytesPerToken, 131072, 1e-9)
	// 80 GB × 0.9 − 16.06 GB − 2 GiB.
	within(t, "KV memory (B)", d.KVBytesForCache, 80e9*0.9-16.06e9-2*(1<<30), 1e-9)
	p := d.Profile
	if p.NumBlocks != 25650 || p.BlockSize != 16 {
		t.Errorf("blocks %d × %d, want 25,650 × 16", p.NumBlocks, p.BlockSize)
	}
	// vLLM's defaults for a ≥ 70 GiB non-A100 GPU, OpenAI server.
	if p.MaxBatchTokens != 8192 || p.MaxNumSeqs != 1024 {
		t.Errorf("batch defaults %d tokens, %d seqs; want 8192, 1024", p.MaxBatchTokens, p.MaxNumSeqs)
	}
	// 16.06 GB ÷ (3.35 TB/s × 0.80) + 0.5 ms = 6.49 ms.
	within(t, "step overhead (s)", p.StepOverhead.Seconds(), 16.06e9/(3.35e12*0.8)+0.5e-3, 1e-6)
	// 2 × 8.03e9 FLOP ÷ (989 TFLOPS × 0.32) = 50.7 µs.
	within(t, "prefill per token (s)", p.PrefillPerToken.Seconds(), 2*8.03e9/(989e12*0.32), 1e-4) // rounded to ns
	if p.DecodePerSeq != p.PrefillPerToken {
		t.Errorf("decode per seq %v, want the prefill per-token GEMM cost %v", p.DecodePerSeq, p.PrefillPerToken)
	}
	// 4 × 32 layers × 32 heads × 128 ÷ (989 TFLOPS × 0.32) per token per context token.
	within(t, "attention per context token (s)", p.AttnPerCtxToken, 4*32*32*128/(989e12*0.32), 1e-9)
	// 131,072 B ÷ (3.35 TB/s × 0.80) = 48.9 ns per context token.
	within(t, "decode KV read per context token (s)", p.DecodeKVPerCtxToken, 131072/(3.35e12*0.8), 1e-9)
	if p.RequestOverhead != DefaultRequestOverhead || p.SlidingWindow != 0 {
		t.Errorf("request overhead %v, window %d", p.RequestOverhead, p.SlidingWindow)
	}
	// The published anchors of h100-8b (BENCHMARKS.md): ~20k prefill tok/s, 150–200
	// decode tok/s per sequence at low concurrency, ~400k tokens of KV.
	within(t, "prefill tok/s", p.PrefillTokensPerSecond(), 19403, 0.01)
	within(t, "decode tok/s", p.DecodeTokensPerSecond(), 152.8, 0.01)
}

func TestDeriveTensorParallelAndSlidingWindow(t *testing.T) {
	d, err := Derive("x", GPUH100, ModelLlama31_70B, VLLM{TP: 4})
	if err != nil {
		t.Fatal(err)
	}
	within(t, "70B weights per GPU", d.WeightBytesPerGPU, 70.6e9*2/4, 1e-9)
	// 8 KV heads over 4 GPUs: 2 per GPU → 2 × 80 × 2 × 128 × 2 B.
	within(t, "70B KV bytes per token per GPU", d.KVBytesPerToken, 81920, 1e-9)
	// Weights read + host + 2 all-reduces per layer.
	within(t, "70B step overhead", d.StepOverhead.Seconds(), 35.3e9/(3.35e12*0.8)+0.5e-3+2*80*12e-6, 1e-6)
	if d.NumBlocks != 26361 {
		t.Errorf("70B TP4 blocks %d, want 26,361", d.NumBlocks)
	}
	// TP beyond the KV heads replicates them: one head per GPU, not 8/16.
	if d16, err := Derive("x", GPUH100, ModelLlama31_70B, VLLM{TP: 16}); err != nil || d16.KVBytesPerToken != 2*80*1*128*2 {
		t.Errorf("TP16 KV bytes per token %v, %v", d16.KVBytesPerToken, err)
	}
	g, err := Derive("x", GPUL40S, ModelGemma3_27B_FP8, VLLM{})
	if err != nil {
		t.Fatal(err)
	}
	// FP8 weights use the FP8 peak; attention runs at the BF16 peak.
	within(t, "gemma prefill per token", g.PrefillPerToken.Seconds(), 2*27.4e9/(733e12*0.22), 1e-4)
	within(t, "gemma attention per context token", g.AttnPerCtxToken, 4*62*32*128/(362e12*0.22), 1e-9)
	within(t, "gemma sliding fraction", g.SlidingFraction, 52.0/62, 1e-12)
	if g.SlidingWindow != 1024 || g.MaxBatchTokens != 2048 || g.MaxNumSeqs != 256 {
		t.Errorf("gemma window %d, batch %d, seqs %d", g.SlidingWindow, g.MaxBatchTokens, g.MaxNumSeqs)
	}
	// vLLM's small-GPU defaults also apply to an 80 GB A100 (by name).
	if a, _ := Derive("x", GPUA100, ModelLlama2_13B, VLLM{}); a.MaxBatchTokens != 2048 || a.MaxNumSeqs != 256 {
		t.Errorf("A100 batch defaults %d, %d", a.MaxBatchTokens, a.MaxNumSeqs)
	}
}

func TestDeriveRejectsWhatCannotRun(t *testing.T) {
	if _, err := Derive("x", GPUL4, ModelLlama31_70B, VLLM{}); err == nil {
		t.Error("70B BF16 on one 24 GB L4 derived")
	}
	if _, err := Derive("x", GPUA100, ModelGemma3_27B_FP8, VLLM{}); err == nil {
		t.Error("FP8 weights on an A100 (no FP8 tensor cores) derived")
	}
	bad := ModelLlama31_8B
	bad.SlidingLayers = 4 // without a window
	if _, err := Derive("x", GPUH100, bad, VLLM{}); err == nil {
		t.Error("sliding layers without a window derived")
	}
	if _, err := Derive("x", GPU{Name: "none"}, ModelLlama31_8B, VLLM{}); err == nil {
		t.Error("GPU without figures derived")
	}
}

// TestBuiltInProfilesStayNearTheirAnchors pins every built-in profile's derived figures
// (changing a recipe changes these on purpose) and checks l40s-27b and h100-8b against the
// published anchors their hand-set predecessors had (BENCHMARKS.md, "Simulator").
func TestBuiltInProfilesStayNearTheirAnchors(t *testing.T) {
	for _, c := range []struct {
		name             string
		overhead         time.Duration
		prefillTokPerSec float64
		decodeTokPerSec  float64
		blocks           int
	}{
		{"l40s-27b", 38809368, 2787, 25.5, 2067},
		{"h100-8b", 6492537, 19403, 152.8, 25650},
		{"h100-70b-tp4", 15591642, 8815, 63.7, 26361},
		{"h200-8b", 4682292, 19487, 211.3, 51828},
		{"a100-13b", 17260193, 4613, 57.2, 3345},
		{"l4-8b", 64480392, 2110, 15.4, 1617},
	} {
		p, err := LookupProfile(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if p.StepOverhead != c.overhead || p.NumBlocks != c.blocks {
			t.Errorf("%s: step overhead %d ns, blocks %d; want %d, %d", c.name, p.StepOverhead, p.NumBlocks, c.overhead, c.blocks)
		}
		within(t, c.name+" prefill tok/s", p.PrefillTokensPerSecond(), c.prefillTokPerSec, 0.002)
		within(t, c.name+" decode tok/s", p.DecodeTokensPerSecond(), c.decodeTokPerSec, 0.003)
	}
	// Anchors: l40s-27b was 32 ms / 2,870 prefill tok/s / 31 decode tok/s / 32k tokens;
	// h100-8b 5.5 ms / 19,700 / 180 / 393k tokens.
	l, h := Profiles["l40s-27b"], Profiles["h100-8b"]
	within(t, "l40s-27b prefill vs its anchor", l.PrefillTokensPerSecond(), 2870, 0.05)
	within(t, "l40s-27b KV tokens vs its anchor", float64(l.NumBlocks*l.BlockSize), 32768, 0.03)
	within(t, "l40s-27b decode vs its anchor", l.DecodeTokensPerSecond(), 31, 0.2) // weights ÷ 85 % of 864 GB/s: see BENCHMARKS.md
	within(t, "h100-8b prefill vs its anchor", h.PrefillTokensPerSecond(), 19700, 0.05)
	within(t, "h100-8b decode vs its anchor", h.DecodeTokensPerSecond(), 180, 0.2)
	within(t, "h100-8b KV tokens vs its anchor", float64(h.NumBlocks*h.BlockSize), 393216, 0.05)
}

func TestDecodeStepCostGrowsWithContext(t *testing.T) {
	p := Profiles["l40s-27b"]
	step := func(ctx int) time.Duration {
		return p.StepCost(StepWork{DecodeSeqs: 1, DecodeContext: p.EffectiveContext(ctx)})
	}
	// Below the window every layer reads the whole context.
	if got, want := step(1000)-step(0), time.Duration(1000*p.DecodeKVPerCtxToken*1e9); got != want {
		t.Errorf("KV read of 1,000 tokens %v, want %v", got, want)
	}
	// Above it only the full-attention layers (10 of 62) keep growing.
	grow := (step(16000) - step(6000)).Seconds()
	within(t, "KV read of 10,000 more tokens", grow, 10000*(1-p.SlidingFraction)*p.DecodeKVPerCtxToken, 1e-6)
	// A sequence at 15k tokens costs several times the context-free per-sequence term
	// (issue 12: "2.6–14× too cheap").
	if r := (step(15000) - p.StepOverhead).Seconds() / p.DecodePerSeq.Seconds(); r < 5 {
		t.Errorf("15k-token decode costs %.1f× the per-sequence GEMMs, want ≥ 5×", r)
	}
	h := Profiles["h100-8b"] // no sliding window: linear in context
	within(t, "h100-8b decode KV read at 12k tokens", h.StepCost(StepWork{DecodeSeqs: 1, DecodeContext: h.EffectiveContext(12000)}).Seconds()-
		h.StepTime(0, 1).Seconds(), 12000*131072/(3.35e12*0.8), 1e-6)
}

func TestEngineChargesContextInEveryStep(t *testing.T) {
	p := testProfile()
	p.AttnPerCtxToken, p.DecodeKVPerCtxToken = 1e-9, 1e-6 // 1 ns per token², 1 µs per context token
	e, err := NewEngine(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 100 prompt tokens in chunks of 64 and 36, then 2 decodes.
	if err := e.Add(&Request{ID: "a", Prompt: seqTokens(0, 100), MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	var ds []time.Duration
	for !e.Idle() {
		d, _, _, _ := e.Step()
		ds = append(ds, d)
	}
	if len(ds) != 4 {
		t.Fatalf("%d steps, want 4 (2 prefill chunks + 2 decodes)", len(ds))
	}
	// Chunk 1: Σ_{k=1}^{64} k = 2,080 token² of attention; chunk 2: Σ_{k=65}^{100} k = 2,970.
	if want := p.StepTime(64, 0) + 2080*time.Nanosecond; ds[0] != want {
		t.Errorf("first chunk %v, want %v", ds[0], want)
	}
	if want := p.StepTime(36, 0) + 2970*time.Nanosecond; ds[1] != want {
		t.Errorf("second chunk %v, want %v", ds[1], want)
	}
	// Decodes at context 101 and 102 (the token being generated attends to itself).
	for i, ctx := range []int{101, 102} {
		if want := p.StepTime(0, 1) + time.Duration(ctx)*time.Microsecond; ds[i+2] != want {
			t.Errorf("decode step %d: %v, want %v", i, ds[i+2], want)
		}
	}
}

func TestPrefillAttnAcrossTheWindow(t *testing.T) {
	p := Profile{SlidingWindow: 10, SlidingFraction: 0.5}
	// Tokens 6..15: full layers Σk = 105; sliding layers 6+7+8+9+10 + 5×10 = 90.
	if got := p.PrefillAttn(5, 10); got != 0.5*105+0.5*90 {
		t.Errorf("across the window %v, want 97.5", got)
	}
	if got := p.PrefillAttn(20, 4); got != 0.5*(21+22+23+24)+0.5*40 {
		t.Errorf("past the window %v", got)
	}
	if got := p.PrefillAttn(0, 4); got != 10 {
		t.Errorf("inside the window %v, want 10", got)
	}
	if p.PrefillAttn(3, 0) != 0 || p.EffectiveContext(8) != 8 || p.EffectiveContext(30) != 20 {
		t.Error("edge cases")
	}
}

func TestRequestOverheadDelaysSchedulingOnAHit(t *testing.T) {
	p := testProfile()
	p.RequestOverhead = 25 * time.Millisecond
	run := func(prof Profile) []time.Duration {
		clock := NewClock(time.Unix(0, 0))
		e, _ := NewEngine(prof, 1)
		var first []time.Duration
		start := clock.Now()
		var v *VirtualEngine
		v = NewVirtualEngine(e, clock, func(o Output) {
			if o.First {
				first = append(first, clock.Now().Sub(start))
			}
			if o.Finished && len(first) == 1 {
				start = clock.Now()
				if err := v.Submit(&Request{ID: "b", Prompt: seqTokens(0, 65), MaxTokens: 1}); err != nil {
					t.Error(err)
				}
			}
		}, nil)
		if err := v.Submit(&Request{ID: "a", Prompt: seqTokens(0, 65), MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		clock.Run()
		return first
	}
	plain, over := run(testProfile()), run(p)
	if len(plain) != 2 || len(over) != 2 {
		t.Fatalf("first tokens %v / %v", plain, over)
	}
	// Both the miss and the hit (64 of 65 tokens cached) pay the overhead once.
	for i := range plain {
		if over[i]-plain[i] != p.RequestOverhead {
			t.Errorf("request %d: TTFT %v with overhead, %v without; want +%v", i, over[i], plain[i], p.RequestOverhead)
		}
	}
	e, _ := NewEngine(p, 1)
	v := NewVirtualEngine(e, NewClock(time.Unix(0, 0)), func(Output) {}, nil)
	if err := v.Submit(&Request{ID: "x"}); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty prompt with overhead: %v", err)
	}
}

func TestRunnerRequestOverheadAndCancelDuringIt(t *testing.T) {
	p := testProfile()
	p.RequestOverhead = 20 * time.Millisecond
	e, _ := NewEngine(p, 1)
	r := NewRunner(e, RunnerOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	if _, err := r.Submit(&Request{ID: "long", Prompt: seqTokens(0, 1<<20), MaxTokens: 1}); !errors.Is(err, ErrTooLong) {
		t.Errorf("too long with overhead: %v", err)
	}
	// Cancelled while still in its overhead: the stream closes and the engine never sees it.
	gone := &Request{ID: "gone", Prompt: seqTokens(0, 40), MaxTokens: 2}
	ch, err := r.Submit(gone)
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel(gone)
	if _, open := <-ch; open {
		t.Error("cancelled stream still open")
	}
	ok := &Request{ID: "ok", Prompt: seqTokens(100, 40), MaxTokens: 2}
	ch, err = r.Submit(ok)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for o := range ch {
		n++
		if o.Req != ok {
			t.Errorf("output of %s on ok's stream", o.Req.ID)
		}
	}
	if n != 2 {
		t.Errorf("%d outputs, want 2", n)
	}
	// Had the cancelled request entered the engine when its overhead ran out, the engine
	// would count its 40 prompt tokens; give its timer ample time to fire.
	for end := time.Now().Add(50 * p.RequestOverhead); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if st := r.Stats(); st.PrefixQueries != 40 || st.Running+st.Waiting != 0 {
			t.Fatalf("the cancelled request reached the engine: %+v", st)
		}
	}
}
