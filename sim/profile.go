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
// Step time (one engine iteration, vllm/v1/engine/core.py step()) is
//
//	StepOverhead + PrefillPerToken × scheduled prefill tokens + DecodePerSeq × decoding sequences
//
// which is the usual roofline shape: a decode step is bound by reading the weights once
// (StepOverhead), each extra sequence adds its KV reads (DecodePerSeq), and prefill is
// compute bound (PrefillPerToken).
type Profile struct {
	Name            string
	Model           string        // served model name
	StepOverhead    time.Duration // fixed time per engine step (weights read, scheduling, sampling)
	PrefillPerToken time.Duration // per scheduled prompt token
	DecodePerSeq    time.Duration // per decoding sequence in the step
	BlockSize       int           // tokens per KV block (vLLM --block-size)
	NumBlocks       int           // KV cache capacity in blocks (vLLM num_gpu_blocks)
	MaxNumSeqs      int           // vLLM --max-num-seqs
	MaxBatchTokens  int           // vLLM --max-num-batched-tokens (chunked prefill budget per step)
}

// Profiles holds the built-in profiles by name. The numbers are roofline estimates
// checked against published vLLM measurements (sources below and in BENCHMARKS.md,
// section "Simulator"):
//   - L40S memory bandwidth 864 GB/s, ~0.72 TB/s achievable (ai-hpc.github.io L40S
//     benchmark guide); Qwen2.5-32B FP8 on 4× L40S with vLLM: ~5,400 prefill tok/s and
//     55 ms TBT at batch 8, memory-bandwidth bound (evokernel-specs case
//     qwencoder-l40sx4-vllm-001).
//   - Llama-3.1-8B BF16 with vLLM: ~75 tok/s per request at concurrency 1 on an A100
//     40 GB at ~77% of its 1.55 TB/s (johnmusgrave.com vLLM sweep), i.e. ~165 tok/s at
//     the H100's 3.35 TB/s; ~12,500 output tok/s aggregate on one H100 (morphllm.com
//     vLLM benchmarks).
//
// l40s-27b: one L40S (48 GB, 864 GB/s, 362 TFLOPS dense FP8) serving a ~27B model in FP8
// (Gemma-3-27B / Qwen3-32B class). Decode: 27 GB of weights per step at ~85% of the
// bandwidth ≈ 33 ms → ~30 tokens/s per sequence at small batch (the figure Kinference's
// 3× L40S 27B FP8 setup implies). Prefill: 2 × 27e9 FLOP/token at ~45% MFU ≈ 3,000
// tokens/s, consistent with published vLLM L40S runs of 27–32B FP8 models (2.5–3.5k
// prompt tokens/s). KV: ~14 GB left after weights and activations at
// gpu_memory_utilization 0.9, FP8 KV ~250 KB/token → ~55k tokens; we take 32k tokens
// (2,048 blocks of 16) to account for the sliding-window/hybrid layout overheads and
// CUDA graphs. vLLM defaults: max_num_seqs 256, max_num_batched_tokens 2048 (V1 online
// serving default with chunked prefill on non-H100 GPUs).
//
// h100-8b: one H100 SXM (80 GB, 3.35 TB/s, 989 TFLOPS BF16) serving Llama-3.1-8B in BF16.
// Decode: 16 GB per step ≈ 5–6 ms → ~170 tokens/s per sequence at small batch (vLLM's
// published Llama-3.1-8B H100 runs report 150–200 output tokens/s per request at low
// concurrency). Prefill ≈ 20,000 tokens/s (2 × 8e9 FLOP/token at ~35% MFU; vLLM
// benchmark dashboards show 15–25k input tokens/s). KV: 128 KB/token (32 layers × 8 KV
// heads × 128 × 2 × 2 B), ~50 GB free → ~400k tokens; 24,576 blocks of 16. vLLM's H100
// default max_num_batched_tokens for online serving is 8192.
var Profiles = map[string]Profile{
	"l40s-27b": {Name: "l40s-27b", Model: "google/gemma-3-27b-it", StepOverhead: 32 * time.Millisecond,
		PrefillPerToken: 333 * time.Microsecond, DecodePerSeq: 250 * time.Microsecond,
		BlockSize: 16, NumBlocks: 2048, MaxNumSeqs: 256, MaxBatchTokens: 2048},
	"h100-8b": {Name: "h100-8b", Model: "meta-llama/Llama-3.1-8B-Instruct", StepOverhead: 5500 * time.Microsecond,
		PrefillPerToken: 50 * time.Microsecond, DecodePerSeq: 40 * time.Microsecond,
		BlockSize: 16, NumBlocks: 24576, MaxNumSeqs: 256, MaxBatchTokens: 8192},
}

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

// StepTime is the duration of a step with the given scheduled prefill tokens and decoding sequences.
func (p Profile) StepTime(prefillTokens, decodeSeqs int) time.Duration {
	return p.StepOverhead + time.Duration(prefillTokens)*p.PrefillPerToken + time.Duration(decodeSeqs)*p.DecodePerSeq
}

func (p Profile) validate() error {
	if p.BlockSize <= 0 || p.NumBlocks <= 0 || p.MaxNumSeqs <= 0 || p.MaxBatchTokens <= 0 {
		return fmt.Errorf("sim: profile %q: block_size, num_blocks, max_num_seqs and max_num_batched_tokens must be positive", p.Name)
	}
	return nil
}
