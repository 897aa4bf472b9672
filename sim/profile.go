// Package sim models a vLLM v1 engine closely enough to benchmark routing: continuous
// batching under max_num_seqs and a per-step token budget with chunked prefill, a paged
// KV cache with prefix caching and LRU eviction, preemption when the cache is full, and
// the KV cache events vLLM publishes. The same Engine is driven in real time (Runner,
// used by cmd/vllm-sim) and in virtual time (Clock, used by bench).
package sim

import (
	"fmt"
	"sort"
	"time"
)

// Profile is the speed and size of one simulated worker.
//
// Step time (one engine iteration, vllm/v1/engine/core.py step()) is the roofline sum
//
//	StepOverhead
//	+ PrefillPerToken × scheduled prompt tokens + AttnPerCtxToken × Σ their attention context
//	+ DecodePerSeq × decoding sequences + DecodeKVPerCtxToken × Σ their contexts
//
// A step reads the weights once (StepOverhead, with the host's scheduling and sampling
// time), each token runs the linear layers (PrefillPerToken, DecodePerSeq: compute
// bound), each prompt token attends to the tokens before it (AttnPerCtxToken per
// context token: QKᵀ and AV FLOPs), and each decoding sequence reads its whole KV
// cache (DecodeKVPerCtxToken per context token: KV bytes per token ÷ bandwidth).
// Contexts are effective contexts: on the SlidingFraction of layers with sliding-window
// attention they stop at SlidingWindow tokens. Profiles built by Derive come from GPU,
// model and vLLM figures; zero attention and KV terms give the context-free model.
type Profile struct {
	Name            string
	Model           string        // served model name
	StepOverhead    time.Duration // fixed time per engine step (weights read, scheduling, sampling)
	PrefillPerToken time.Duration // per scheduled prompt token
	DecodePerSeq    time.Duration // per decoding sequence in the step
	// AttnPerCtxToken is seconds per (scheduled prompt token × effective context token).
	AttnPerCtxToken float64
	// DecodeKVPerCtxToken is seconds per effective context token of each decoding
	// sequence (its KV read).
	DecodeKVPerCtxToken float64
	SlidingWindow       int     // tokens; 0 none
	SlidingFraction     float64 // fraction of layers with sliding-window attention
	// RequestOverhead is paid once per request before it can be scheduled (API server
	// parsing, tokenization, engine-core IPC, detokenizing), on a hit as on a miss.
	RequestOverhead time.Duration
	BlockSize       int // tokens per KV block (vLLM --block-size)
	NumBlocks       int // KV cache capacity in blocks (vLLM num_gpu_blocks)
	MaxNumSeqs      int // vLLM --max-num-seqs
	MaxBatchTokens  int // vLLM --max-num-batched-tokens (chunked prefill budget per step)
	// MaxLoRAs is vLLM's --max-loras: adapters held in GPU slots and distinct adapters
	// one step may run (lora.go); 0 disables LoRA (adapter requests are refused).
	MaxLoRAs int
	// LoRALoadTime is the time one adapter load adds to the step that loads it (the
	// model runner loads missing adapters before executing the step).
	LoRALoadTime time.Duration
	// P/D (pd.go): KV bytes of one token on one GPU (2 × layers × KV heads ÷ TP × head
	// dim × KV dtype bytes, Derive), and the link a decode engine reads a remote
	// prefill's KV over: bytes per second (0: no bandwidth term) and a fixed latency per
	// read. TransferTime combines them.
	KVBytesPerToken          float64
	KVTransferBytesPerSecond float64
	KVTransferLatency        time.Duration
}

// Profiles holds the built-in profiles by name, each derived (Derive) from its Recipe:
// GPU datasheet figures, the model's config.json and vLLM's default settings for that
// GPU. BENCHMARKS.md, section "Simulator", lists the derived figures, their published
// anchors and the sources.
var Profiles = func() map[string]Profile {
	out := map[string]Profile{}
	for n := range Recipes {
		out[n] = mustDerive(n)
	}
	return out
}()

// ProfileNames returns the built-in profile names, sorted.
func ProfileNames() []string {
	var out []string
	for n := range Profiles {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LookupProfile returns the named built-in profile.
func LookupProfile(name string) (Profile, error) {
	p, ok := Profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("sim: unknown profile %q (one of %v)", name, ProfileNames())
	}
	return p, nil
}

// PrefillTokensPerSecond is the prompt throughput of one request alone with full chunks.
func (p Profile) PrefillTokensPerSecond() float64 {
	step := p.StepOverhead + time.Duration(p.MaxBatchTokens)*p.PrefillPerToken
	return float64(p.MaxBatchTokens) / step.Seconds()
}

// DecodeTokensPerSecond is the generation speed of one sequence alone.
func (p Profile) DecodeTokensPerSecond() float64 {
	return 1 / (p.StepOverhead + p.DecodePerSeq).Seconds()
}

// StepTime is the duration of a step with the given scheduled prefill tokens and
// decoding sequences, without the context terms.
func (p Profile) StepTime(prefillTokens, decodeSeqs int) time.Duration {
	return p.StepCost(StepWork{PrefillTokens: prefillTokens, DecodeSeqs: decodeSeqs})
}

// StepWork is what one engine step computes.
type StepWork struct {
	PrefillTokens int     // scheduled prompt tokens
	PrefillAttn   float64 // Σ over them of their effective attention context, tokens
	DecodeSeqs    int     // decoding sequences
	DecodeContext float64 // Σ over them of their effective context, tokens
}

// StepCost is the duration of a step doing w (Profile's formula).
func (p Profile) StepCost(w StepWork) time.Duration {
	d := p.StepOverhead + time.Duration(w.PrefillTokens)*p.PrefillPerToken + time.Duration(w.DecodeSeqs)*p.DecodePerSeq
	return d + time.Duration((p.AttnPerCtxToken*w.PrefillAttn+p.DecodeKVPerCtxToken*w.DecodeContext)*1e9)
}

// EffectiveContext is c tokens of context averaged over the layers: sliding-window
// layers see at most SlidingWindow of them.
func (p Profile) EffectiveContext(c int) float64 {
	if p.SlidingWindow <= 0 || p.SlidingFraction <= 0 || c <= p.SlidingWindow {
		return float64(c)
	}
	return (1-p.SlidingFraction)*float64(c) + p.SlidingFraction*float64(p.SlidingWindow)
}

// PrefillAttn is the attention work of prefilling prompt tokens start+1 .. start+n
// (start already computed): Σ of each token's effective context (itself included).
func (p Profile) PrefillAttn(start, n int) float64 {
	if n <= 0 {
		return 0
	}
	// Σ_{k=a}^{b} k, and the same with k capped at the window.
	a, b := float64(start+1), float64(start+n)
	full := (a + b) * float64(n) / 2
	if p.SlidingWindow <= 0 || p.SlidingFraction <= 0 {
		return full
	}
	w := float64(p.SlidingWindow)
	var capped float64
	switch {
	case b <= w:
		capped = full
	case a > w:
		capped = float64(n) * w
	default:
		capped = (a+w)*(w-a+1)/2 + (b-w)*w
	}
	return (1-p.SlidingFraction)*full + p.SlidingFraction*capped
}

func (p Profile) validate() error {
	if p.BlockSize <= 0 || p.NumBlocks <= 0 || p.MaxNumSeqs <= 0 || p.MaxBatchTokens <= 0 {
		return fmt.Errorf("sim: profile %q: block_size, num_blocks, max_num_seqs and max_num_batched_tokens must be positive", p.Name)
	}
	if p.MaxLoRAs < 0 || p.LoRALoadTime < 0 {
		return fmt.Errorf("sim: profile %q: max_loras and lora_load_time must be ≥ 0", p.Name)
	}
	if p.KVBytesPerToken < 0 || p.KVTransferBytesPerSecond < 0 || p.KVTransferLatency < 0 {
		return fmt.Errorf("sim: profile %q: KV bytes per token, KV transfer bytes per second and KV transfer latency must be ≥ 0", p.Name)
	}
	return nil
}
