"""Per-step costs of a hardware pair for the SSD projection: a tensor-parallel target and a drafter on its
own GPU, from bytes moved over HBM bandwidth, a per-step fixed overhead and NVLink all-reduces.

    from ssd_costs import H100_SXM, LLAMA_33_70B, step_s  # from scripts/studies (ssd_projection.py)
    step_s(LLAMA_33_70B, H100_SXM, tp=4, tokens=8)       # one verification of 7 drafted tokens + 1, seconds

It is a projection, not a measurement: every constant below names its source or says it is an assumption.

The step model (batch 1 decoding is memory-bound):
    memory  = (weight bytes read / tp + batch * context * KV bytes per token / tp) / (HBM peak * efficiency)
    compute = 2 * matmul params * tokens * batch / tp / (bf16 dense peak * MFU)
    step    = max(memory, compute) + overhead + all-reduces
    all-reduce (per call) = latency + 2 (tp - 1) / tp * message bytes / NVLink one-way bandwidth
with 2 all-reduces per decoder layer under Megatron tensor parallelism (after attention's o_proj and after
the MLP's down_proj). A verification of k tokens reads the same weights as one token, so it is flat in k
until k * 2 FLOP/param crosses the ridge point (989e12 / (3.35e12 * 0.8) ~ 369 FLOP/byte here: k in the
hundreds), which is why the draft length costs the target almost nothing.

Overheads: a target step pays the engine's per-step fixed cost, calibrated so that the model reproduces a
published measurement (SGLang, Llama-3.1-8B bf16, batch 1, one H100: 158.34 tok/s, EAGLE-3 paper arXiv
2503.01840 Table 4, also in SGLang's speculative-decoding docs). A drafter forward inside a CUDA-graphed
drafting loop has no scheduler step: it pays `draft_base_s + layers * draft_layer_s` (an assumption, kernel
launch bound: ~10 kernels per decoder layer at ~1 us each inside a graph).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BF16 = 2  # bytes per parameter / activation element


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_s: float  # peak HBM bandwidth
    hbm_efficiency: float  # fraction of the peak a decode step's weight stream sustains (assumption)
    bf16_flops: float  # dense bf16 tensor-core peak
    mfu: (
        float  # fraction of that peak a verification matmul reaches (assumption; only matters past the ridge)
    )
    nvlink_bytes_s: float  # NVLink bandwidth per GPU, one direction
    allreduce_latency_s: float  # fixed cost of one small all-reduce (assumption)
    p2p_latency_s: float  # one small message between two GPUs of a node, one way (assumption)
    target_overhead_s: float  # fixed cost of one engine step of the target (calibrated, see calibrate)
    draft_base_s: float  # fixed cost of one drafter forward in a CUDA-graphed loop (assumption)
    draft_layer_s: float  # ... plus this per decoder layer (assumption)

    @property
    def hbm_sustained_s(self) -> float:
        return self.hbm_bytes_s * self.hbm_efficiency


@dataclass(frozen=True)
class Model:
    """A dense decoder's decode-step shape: what one forward reads and computes."""

    name: str
    params: int  # every parameter, counted once
    read_bytes: int  # bytes one decode step reads (an untied input embedding: one row, left out)
    matmul_params: int  # parameters in the matmuls a token goes through (FLOPs = 2 per param per token)
    layers: int
    hidden: int
    kv_bytes_token: int  # KV cache bytes per token of context, all layers


def llama_layer_params(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, in_mult: int = 1):
    """One Llama decoder layer: q/k/v (input width in_mult * hidden; EAGLE-3's first layer reads 2x),
    o, gate/up/down, and its two RMSNorm weights."""
    width = in_mult * hidden
    attn = width * heads * head_dim + 2 * width * kv_heads * head_dim + heads * head_dim * hidden
    return attn + 3 * hidden * inter + 2 * hidden


def llama(name, hidden, inter, layers, heads, kv_heads, head_dim, vocab, tied) -> Model:
    """A Llama-3 family model from its config.json numbers (bf16)."""
    layer = llama_layer_params(hidden, inter, heads, kv_heads, head_dim)
    embed = vocab * hidden
    params = layers * layer + hidden + embed * (1 if tied else 2)  # + final norm; an untied LM head
    matmul = layers * (layer - 2 * hidden) + embed  # the LM head is a matmul; norms and the lookup are not
    read = params - (0 if tied else embed)  # tied: the table is the LM head, read in full
    kv = 2 * layers * kv_heads * head_dim * BF16
    return Model(name, params, read * BF16, matmul, layers, hidden, kv)


def eagle3_head(name, hidden, inter, heads, kv_heads, head_dim, draft_vocab) -> tuple[Model, int]:
    """An EAGLE-3 head (one decoder layer whose q/k/v read [embedding; feature] = 2 * hidden, the fc that
    fuses 3 target features, a final norm and a draft-vocabulary LM head; the input embedding is the
    target's, of which a step reads one row). Returns (the per-step model without fc, fc's params): the fc
    runs once per chain, on the target's features, so a chain of K reads it once."""
    layer = llama_layer_params(hidden, inter, heads, kv_heads, head_dim, in_mult=2) + hidden  # + hidden_norm
    head = hidden * draft_vocab
    fc = 3 * hidden * hidden
    step_params = layer + hidden + head  # + final norm
    matmul = layer - 3 * hidden + head
    kv = 2 * kv_heads * head_dim * BF16
    return Model(name, step_params + fc, step_params * BF16, matmul, 1, hidden, kv), fc


# config.json numbers: meta-llama/Llama-3.3-70B-Instruct, Llama-3.2-1B(-Instruct), Llama-3.1-8B-Instruct,
# yuhuili/EAGLE3-LLaMA3.3-Instruct-70B (draft_vocab_size 32000). The totals match the published counts
# 70,553,706,496 / 1,235,814,400 / 8,030,261,248 (tests/runtime/test_ssd_projection.py checks it).
LLAMA_33_70B = llama("Llama-3.3-70B", 8192, 28672, 80, 64, 8, 128, 128256, tied=False)
LLAMA_32_1B = llama("Llama-3.2-1B", 2048, 8192, 16, 32, 8, 64, 128256, tied=True)
LLAMA_31_8B = llama("Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128, 128256, tied=False)
EAGLE3_70B, EAGLE3_70B_FC = eagle3_head("EAGLE-3 head (70B)", 8192, 28672, 64, 8, 128, 32000)

SGLANG_8B_TOKENS_S = 158.34  # EAGLE-3 paper Table 4: SGLang v0.4.4, Llama-3.1-8B, 1x H100, batch 1, no spec
CALIBRATION_CONTEXT = 512  # MT-bench-like context for that measurement (assumption; KV is ~0.4% of bytes)


def memory_s(model: Model, gpu: Gpu, tp: int, context: int, batch: int = 1) -> float:
    return (model.read_bytes / tp + batch * context * model.kv_bytes_token / tp) / gpu.hbm_sustained_s


def compute_s(model: Model, gpu: Gpu, tp: int, tokens: int, batch: int = 1) -> float:
    return 2 * model.matmul_params * tokens * batch / tp / (gpu.bf16_flops * gpu.mfu)


def allreduce_s(gpu: Gpu, tp: int, message_bytes: int) -> float:
    """One ring-style all-reduce of `message_bytes` over tp GPUs (0 at tp = 1)."""
    if tp == 1:
        return 0.0
    return gpu.allreduce_latency_s + 2 * (tp - 1) / tp * message_bytes / gpu.nvlink_bytes_s


def comm_s(model: Model, gpu: Gpu, tp: int, tokens: int, batch: int = 1) -> float:
    """2 all-reduces per layer of a [batch * tokens, hidden] bf16 activation."""
    return 2 * model.layers * allreduce_s(gpu, tp, batch * tokens * model.hidden * BF16)


def step_s(
    model: Model, gpu: Gpu, tp: int = 1, tokens: int = 1, context: int = 1024, batch: int = 1, draft=False
) -> float:
    """One forward of `tokens` new tokens per row over `batch` rows: max(memory, compute) + the fixed
    overhead (a target's engine step, or a drafter's in-loop forward) + all-reduces."""
    body = max(memory_s(model, gpu, tp, context, batch), compute_s(model, gpu, tp, tokens, batch))
    fixed = gpu.draft_base_s + model.layers * gpu.draft_layer_s if draft else gpu.target_overhead_s
    return body + fixed + comm_s(model, gpu, tp, tokens, batch)


def calibrate(gpu: Gpu, measured_tokens_s: float = SGLANG_8B_TOKENS_S, model: Model = LLAMA_31_8B) -> Gpu:
    """The GPU with `target_overhead_s` set so that plain decoding of `model` on one GPU takes the measured
    step time: overhead = 1 / measured - memory time (the step is memory-bound at batch 1)."""
    body = max(memory_s(model, gpu, 1, CALIBRATION_CONTEXT), compute_s(model, gpu, 1, 1))
    overhead = 1.0 / measured_tokens_s - body
    if overhead < 0:
        raise ValueError(f"the measurement beats the roofline at efficiency {gpu.hbm_efficiency}")
    return replace(gpu, target_overhead_s=overhead)


# NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense bf16 (1,979 with sparsity), NVLink 4 at
# 900 GB/s per GPU (both directions together: 450 GB/s each way).
H100_SXM = calibrate(
    Gpu(
        name="H100 SXM",
        hbm_bytes_s=3.35e12,
        # assumption: a decode step's weight stream sustains ~80% of peak (large-copy benchmarks on HBM3
        # parts reach 80-90%; the rest of the gap to a measured step goes into the calibrated overhead)
        hbm_efficiency=0.80,
        bf16_flops=989e12,
        mfu=0.6,  # assumption
        nvlink_bytes_s=450e9,
        # assumption: one-shot custom all-reduce (vLLM / TensorRT-LLM) of a 16 KB decode activation over
        # NVSwitch, ~8 us; at 160 calls a step (70B) that is ~1.3 ms, ~10-20% of a TP=4/8 step
        allreduce_latency_s=8e-6,
        p2p_latency_s=15e-6,  # assumption: NCCL send/recv of a few KB between two GPUs of a node
        target_overhead_s=0.0,  # set by calibrate
        draft_base_s=50e-6,  # assumption: embedding, final norm, LM head sampling, launch of the graph
        draft_layer_s=10e-6,  # assumption: ~10 kernels per layer at ~1 us each inside a CUDA graph
    )
)
