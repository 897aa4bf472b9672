package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// GPU is one accelerator's datasheet figures plus the fractions vLLM achieves of them.
type GPU struct {
	Name string
	// MemoryBytes is the device memory (what torch.cuda reports as total).
	MemoryBytes float64
	// Bandwidth is the peak memory bandwidth, bytes/s.
	Bandwidth float64
	// FLOPS16 and FLOPS8 are dense (no sparsity) tensor-core peaks for BF16 and FP8, FLOP/s
	// (0: no FP8 tensor cores).
	FLOPS16, FLOPS8 float64
	// BandwidthEff is the fraction of Bandwidth a decode step's weight and KV reads reach.
	BandwidthEff float64
	// ComputeEff is the model FLOPs utilization (MFU) of prefill and decode GEMMs and
	// attention at serving batch sizes.
	ComputeEff float64
	// StepHost is the per-step time that is neither weights nor tokens: scheduling,
	// input preparation, sampling and kernel launches (vLLM V1 with CUDA graphs).
	StepHost time.Duration
	// AllReduce is the latency of one tensor-parallel all-reduce of a step's activations
	// (2 per layer when TP > 1).
	AllReduce time.Duration
}

// Model is the architecture figures of a served model (its Hugging Face config.json).
type Model struct {
	Name        string  // served model name
	Params      float64 // parameters (active per token)
	Layers      int
	QHeads      int // attention (query) heads
	KVHeads     int // key/value heads (GQA)
	HeadDim     int
	WeightBytes float64 // bytes per parameter: 2 BF16, 1 FP8
	// KVBytes is bytes per cached K or V element: 2 for vLLM's kv_cache_dtype "auto" on a
	// BF16 model (also the default for FP8-weight checkpoints without KV scales), 1 for fp8.
	KVBytes float64
	// SlidingLayers of Layers use sliding-window attention over SlidingWindow tokens
	// (Gemma 3: 5 of every 6 layers, window 1,024); their attention and KV reads stop at
	// the window.
	SlidingLayers, SlidingWindow int
}

// VLLM is the serving settings of one vLLM instance (engine arguments).
type VLLM struct {
	GPUMemoryUtilization float64 // --gpu-memory-utilization (default 0.9)
	MaxNumBatchedTokens  int     // --max-num-batched-tokens; 0: vLLM's default for the GPU
	MaxNumSeqs           int     // --max-num-seqs; 0: vLLM's default for the GPU
	TP                   int     // --tensor-parallel-size; 0 means 1
	BlockSize            int     // --block-size; 0 means 16
	// ReservedBytes is per-GPU memory inside the utilization budget that is neither
	// weights nor KV: activations of the profiling run at max_num_batched_tokens, CUDA
	// graphs, NCCL and cuBLAS workspaces. 0 means DefaultReservedBytes.
	ReservedBytes float64
	// RequestOverhead is the time from a request's arrival to it being schedulable and
	// from its first token to the client (API server: parsing, tokenization, detokenizing,
	// the engine-core IPC), paid by every request, hit or miss. 0 means
	// DefaultRequestOverhead.
	RequestOverhead time.Duration
}

// DefaultReservedBytes is the non-KV, non-weight memory assumed per GPU (2 GiB: vLLM's
// startup log on 24–80 GB cards reports 0.5–1.5 GiB of CUDA graphs plus ~1 GiB peak
// activation for a 2k–8k-token profiling batch).
const DefaultReservedBytes = 2 << 30

// DefaultRequestOverhead is the per-request API-server and scheduling time assumed when
// the settings give none.
const DefaultRequestOverhead = 10 * time.Millisecond

const giB = 1 << 30

// Built-in hardware (datasheet figures; efficiencies are fitted to published vLLM
// measurements, see BENCHMARKS.md "Simulator").
var (
	// NVIDIA L40S: 48 GB GDDR6, 864 GB/s, 362 TFLOPS BF16 / 733 TFLOPS FP8 dense.
	GPUL40S = GPU{Name: "L40S", MemoryBytes: 48e9, Bandwidth: 864e9, FLOPS16: 362e12, FLOPS8: 733e12,
		BandwidthEff: 0.85, ComputeEff: 0.22, StepHost: 1500 * time.Microsecond, AllReduce: 25 * time.Microsecond}
	// NVIDIA H100 SXM: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS BF16 / 1,979 TFLOPS FP8 dense.
	GPUH100 = GPU{Name: "H100", MemoryBytes: 80e9, Bandwidth: 3.35e12, FLOPS16: 989e12, FLOPS8: 1979e12,
		BandwidthEff: 0.80, ComputeEff: 0.32, StepHost: 500 * time.Microsecond, AllReduce: 12 * time.Microsecond}
	// NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s, H100's tensor cores.
	GPUH200 = GPU{Name: "H200", MemoryBytes: 141e9, Bandwidth: 4.8e12, FLOPS16: 989e12, FLOPS8: 1979e12,
		BandwidthEff: 0.80, ComputeEff: 0.32, StepHost: 500 * time.Microsecond, AllReduce: 12 * time.Microsecond}
	// NVIDIA A100 SXM 80 GB: HBM2e, 2.04 TB/s, 312 TFLOPS BF16, no FP8.
	GPUA100 = GPU{Name: "A100", MemoryBytes: 80e9, Bandwidth: 2.039e12, FLOPS16: 312e12,
		BandwidthEff: 0.77, ComputeEff: 0.40, StepHost: 700 * time.Microsecond, AllReduce: 15 * time.Microsecond}
	// NVIDIA L4: 24 GB GDDR6, 300 GB/s, 121 TFLOPS BF16 / 242 TFLOPS FP8 dense.
	GPUL4 = GPU{Name: "L4", MemoryBytes: 24e9, Bandwidth: 300e9, FLOPS16: 121e12, FLOPS8: 242e12,
		BandwidthEff: 0.85, ComputeEff: 0.30, StepHost: 1500 * time.Microsecond, AllReduce: 30 * time.Microsecond}
)

// Built-in models (config.json of each).
var (
	ModelGemma3_27B_FP8 = Model{Name: "google/gemma-3-27b-it", Params: 27.4e9, Layers: 62, QHeads: 32, KVHeads: 16, HeadDim: 128,
		WeightBytes: 1, KVBytes: 2, SlidingLayers: 52, SlidingWindow: 1024}
	ModelLlama31_8B = Model{Name: "meta-llama/Llama-3.1-8B-Instruct", Params: 8.03e9, Layers: 32, QHeads: 32, KVHeads: 8, HeadDim: 128,
		WeightBytes: 2, KVBytes: 2}
	ModelLlama31_70B = Model{Name: "meta-llama/Llama-3.1-70B-Instruct", Params: 70.6e9, Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128,
		WeightBytes: 2, KVBytes: 2}
	ModelLlama2_13B = Model{Name: "meta-llama/Llama-2-13b-chat-hf", Params: 13.0e9, Layers: 40, QHeads: 40, KVHeads: 40, HeadDim: 128,
		WeightBytes: 2, KVBytes: 2}
)

// bigGPU reports whether vLLM picks its large batch defaults for g: ≥ 70 GiB of device
// memory and not an A100 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
func bigGPU(g GPU) bool {
	return g.MemoryBytes >= 70*giB && !strings.Contains(strings.ToLower(g.Name), "a100")
}

// Derivation is a profile with the intermediate figures it came from.
type Derivation struct {
	Profile
	WeightBytesPerGPU  float64 // parameters × bytes ÷ TP
	KVBytesPerToken    float64 // per GPU, every layer at full context
	KVBytesForCache    float64 // per GPU: memory × utilization − weights − reserved
	FLOPsPerToken      float64 // 2 × parameters ÷ TP (linear layers, one token)
	AttnFLOPsPerCtxTok float64 // 4 × layers × heads × head_dim ÷ TP, per token per context token
}

// Derive builds a profile of model m served by vLLM with settings v on GPU g (TP GPUs of
// it). Step time is a roofline sum (package doc of Profile):
//
//	StepOverhead    = weights per GPU ÷ (bandwidth × BandwidthEff) + StepHost + 2 × layers × AllReduce (TP > 1)
//	PrefillPerToken = 2 × params ÷ TP ÷ (peak FLOPS of the weight dtype × ComputeEff)
//	DecodePerSeq    = PrefillPerToken (a decode token runs the same GEMMs)
//	AttnPerCtxToken = 4 × layers × heads × head_dim ÷ TP ÷ (BF16 FLOPS × ComputeEff)   (QKᵀ and AV)
//	DecodeKVPerCtxToken = KV bytes per token per GPU ÷ (bandwidth × BandwidthEff)
//	NumBlocks = (memory × gpu_memory_utilization − weights − reserved) ÷ (KV bytes per token × block size)
//
// KV capacity counts every layer at full context (no hybrid allocator: vLLM's hybrid KV
// manager would keep only the window for sliding-window layers). Errors: a model that
// does not fit, or non-positive figures.
func Derive(name string, g GPU, m Model, v VLLM) (Derivation, error) {
	if v.TP <= 0 {
		v.TP = 1
	}
	if v.BlockSize <= 0 {
		v.BlockSize = 16
	}
	if v.GPUMemoryUtilization <= 0 {
		v.GPUMemoryUtilization = 0.9
	}
	if v.ReservedBytes <= 0 {
		v.ReservedBytes = DefaultReservedBytes
	}
	if v.RequestOverhead <= 0 {
		v.RequestOverhead = DefaultRequestOverhead
	}
	big := bigGPU(g)
	if v.MaxNumBatchedTokens <= 0 {
		v.MaxNumBatchedTokens = 2048
		if big {
			v.MaxNumBatchedTokens = 8192
		}
	}
	if v.MaxNumSeqs <= 0 {
		v.MaxNumSeqs = 256
		if big {
			v.MaxNumSeqs = 1024
		}
	}
	if g.Bandwidth <= 0 || g.FLOPS16 <= 0 || g.BandwidthEff <= 0 || g.ComputeEff <= 0 || g.MemoryBytes <= 0 {
		return Derivation{}, fmt.Errorf("sim: derive %s: GPU %q needs memory, bandwidth, BF16 FLOPS and efficiencies", name, g.Name)
	}
	if m.Params <= 0 || m.Layers <= 0 || m.QHeads <= 0 || m.KVHeads <= 0 || m.HeadDim <= 0 || m.WeightBytes <= 0 || m.KVBytes <= 0 ||
		m.SlidingLayers < 0 || m.SlidingLayers > m.Layers || (m.SlidingLayers > 0 && m.SlidingWindow <= 0) {
		return Derivation{}, fmt.Errorf("sim: derive %s: model %q has a non-positive or inconsistent figure", name, m.Name)
	}
	tp := float64(v.TP)
	peak := g.FLOPS16
	if m.WeightBytes <= 1 {
		if g.FLOPS8 <= 0 {
			return Derivation{}, fmt.Errorf("sim: derive %s: %s has no FP8 tensor cores for FP8 weights", name, g.Name)
		}
		peak = g.FLOPS8
	}
	var d Derivation
	d.WeightBytesPerGPU = m.Params * m.WeightBytes / tp
	// With TP above the KV head count, heads are replicated: each GPU holds at least one.
	kvHeads := math.Max(1, float64(m.KVHeads)/tp)
	d.KVBytesPerToken = 2 * float64(m.Layers) * kvHeads * float64(m.HeadDim) * m.KVBytes
	d.KVBytesForCache = g.MemoryBytes*v.GPUMemoryUtilization - d.WeightBytesPerGPU - v.ReservedBytes
	if d.KVBytesForCache <= 0 {
		return Derivation{}, fmt.Errorf("sim: derive %s: %.1f GB of weights per GPU leave no KV cache in %.0f GB × %.2f",
			name, d.WeightBytesPerGPU/1e9, g.MemoryBytes/1e9, v.GPUMemoryUtilization)
	}
	d.FLOPsPerToken = 2 * m.Params / tp
	d.AttnFLOPsPerCtxTok = 4 * float64(m.Layers) * float64(m.QHeads) * float64(m.HeadDim) / tp
	bw := g.Bandwidth * g.BandwidthEff
	seconds := func(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
	over := d.WeightBytesPerGPU/bw + g.StepHost.Seconds()
	if v.TP > 1 {
		over += 2 * float64(m.Layers) * g.AllReduce.Seconds()
	}
	perTok := d.FLOPsPerToken / (peak * g.ComputeEff)
	d.Profile = Profile{
		Name: name, Model: m.Name,
		StepOverhead:        seconds(over),
		PrefillPerToken:     seconds(perTok),
		DecodePerSeq:        seconds(perTok),
		AttnPerCtxToken:     d.AttnFLOPsPerCtxTok / (g.FLOPS16 * g.ComputeEff),
		DecodeKVPerCtxToken: d.KVBytesPerToken / bw,
		SlidingWindow:       m.SlidingWindow,
		SlidingFraction:     float64(m.SlidingLayers) / float64(m.Layers),
		RequestOverhead:     v.RequestOverhead,
		BlockSize:           v.BlockSize,
		NumBlocks:           int(d.KVBytesForCache / (d.KVBytesPerToken * float64(v.BlockSize))),
		MaxNumSeqs:          v.MaxNumSeqs,
		MaxBatchTokens:      v.MaxNumBatchedTokens,
		KVBytesPerToken:     d.KVBytesPerToken,
	}
	return d, d.Profile.validate()
}

// ProfileRecipe is how a built-in profile is derived.
type ProfileRecipe struct {
	GPU   GPU
	Model Model
	VLLM  VLLM
}

// Recipes are the built-in profiles' inputs, by profile name.
var Recipes = map[string]ProfileRecipe{
	"l40s-27b":     {GPU: GPUL40S, Model: ModelGemma3_27B_FP8, VLLM: VLLM{GPUMemoryUtilization: 0.95, ReservedBytes: 1.4e9}},
	"h100-8b":      {GPU: GPUH100, Model: ModelLlama31_8B},
	"h100-70b-tp4": {GPU: GPUH100, Model: ModelLlama31_70B, VLLM: VLLM{TP: 4}},
	"h200-8b":      {GPU: GPUH200, Model: ModelLlama31_8B},
	"a100-13b":     {GPU: GPUA100, Model: ModelLlama2_13B},
	"l4-8b":        {GPU: GPUL4, Model: ModelLlama31_8B},
}

func mustDerive(name string) Profile {
	r := Recipes[name]
	d, err := Derive(name, r.GPU, r.Model, r.VLLM)
	if err != nil {
		panic(err)
	}
	return d.Profile
}
