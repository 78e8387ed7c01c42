"""The memory preflight: bytes per rank a training run will need, estimated from the target's config.json.

    shapes = TargetShapes.load("meta-llama/Llama-3.3-70B-Instruct", torch.bfloat16)  # preflight_shapes.py
    knobs = Knobs.from_config(cfg, shapes)                          # B, T, K, head, mode, ... of a config
    est = estimate(shapes, knobs, Setup("zero2", world_size=8))    # per rank: est.peak, est.terms

Nothing loads: the target and the head are built on the meta device (`torch.device("meta")`) from the
config alone, so parameter bytes are exact per dtype. The rest counts, tensor by tensor and per token,
what the trainer's code keeps (train/eagle3_data.py, train/eagle3_objective.py, train/ttt_attention.py,
train/heads.py, train/mtp_objective.py, train/medusa_objective.py); the objective's `memory` names whose
terms (MEMORY_TERMS: EAGLE-3's unroll, MTP's modules, Medusa's heads):

- resident: the target's weights (offline only its embedding, final norm and LM head), the trainable
  parameters, their gradients and AdamW's moments (+ DeepSpeed's fp32 master), as the strategy shards;
- batch building, one part after another: online EAGLE-3 runs the frozen target row by row under
  no_grad (a KV cache, one layer's working set, the rows' aux states); the padded states; the target's
  draft-vocabulary distributions, built `train.logit_chunk` rows of [., V] logits at a time;
- the step: its inputs, what autograd keeps per TTT step or MTP module (norms, projections' inputs, the
  MLP's [I] tensors), the attention's (decomposed: causal part + diagonal keys, off the CPU the explicit
  [T, T] scores; dense: SDPA over (k+1)T keys with a mask), what the chunked cross-entropy reads, and a
  working set (a chunk recomputed in backward, first gradients, a checkpointed step recomputed).

Peak = resident + max(batch building, the step) (+ on a GPU: CUDA context, NCCL, allocator slack); an
offline run yet to capture adds a capture phase (train/preflight_capture.py). Every position supervised,
rows at full length (the worst case). `Setup.tp` > 1: a group of that many ranks (runtime/core/placement.py:
`tp`, or `ep` with `Setup.dense` False: only the experts split). Activation dtypes: "fp32" (CPU), "amp"
(autocast over float32 parameters: DDP/FSDP on GPUs), "half" (DeepSpeed's bf16 module). Estimates; GB are
1e9 bytes. MoE and MLA targets: weights, KV cache and working set from train/preflight_families.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.runtime.core.errors import BadInputError
from draftsmith.train.preflight_bytes import (  # noqa: F401 (Term, count: re-exported)
    Term,
    act_bytes,
    count,
    gpu_overheads,
    kernel_saved,
    layer_saved,
    linear_inputs,
    norm_saved,
    ttt_kernel,
)
from draftsmith.train.preflight_families import tp_is_what_if
from draftsmith.train.preflight_shapes import TargetShapes, head_parameters, lora_parameters

ZERO_BUCKET, ZERO3_LIVE = 5e8, 1e9  # DeepSpeed's reduce_bucket_size, stage3_max_live_parameters defaults


# ---- what is estimated ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Knobs:
    """The training shape a config asks for (what the estimate reads of a TrainConfig)."""

    head: str  # the head kind (head.type)
    mode: str  # online | offline
    batch: int  # B: rows per micro-batch per rank
    length: int  # T: tokens per row (data.max_length: the padded worst case)
    steps: int  # K: TTT steps (EAGLE-3), modules (MTP) or heads (Medusa): the objective's `steps(cfg)`
    draft_vocab: int
    aux_layers: tuple[int, ...]
    options: dict = field(default_factory=dict)  # the head section's head_options() (fc_norm, feature, ...)
    ttt: bool = True  # the objective unrolls a training-time test (EAGLE-3); else one forward per module
    memory: str = (
        "ttt"  # whose terms (the objective's `memory`): ttt (EAGLE-3), modules (MTP), heads (Medusa)
    )
    labels: str = "target"  # MTP: soft (target) or hard (data) labels
    cotrain: str | None = None  # None, "lora" or "full"
    lora_rank: int = 16
    lora_modules: tuple[str, ...] = ()
    freeze_embeddings: bool = True
    self_distill: bool = False  # Medusa-2 self-distillation: a teacher forward (and maybe a frozen copy)
    attention: str = "decomposed"  # the TTT step's attention (train.ttt_attention)
    logit_chunk: int = 1024  # rows per chunk of target logits and soft cross-entropy (train.logit_chunk)
    checkpointing: bool = False  # the head's layers recomputed in backward (train.activation_checkpointing)

    @classmethod
    def from_config(cls, cfg, shapes: TargetShapes) -> Knobs:
        """The knobs of a TrainConfig, checked against the target as the trainer checks them."""
        from draftsmith.runtime.heads.aux_layers import resolve_aux_layers
        from draftsmith.train.objectives import objective

        h, c, kind = cfg.head, cfg.cotrain, objective(cfg.head.type)
        try:
            aux = tuple(resolve_aux_layers(h.aux_layers, shapes.layers)) if kind.ttt else ()
        except BadInputError as err:
            raise BadInputError("head.aux_layers", err.got, err.expected) from None
        if not 0 < h.draft_vocab_size <= shapes.vocab:
            expected = f"an integer in [1, {shapes.vocab}] (the target's vocabulary)"
            raise BadInputError("head.draft_vocab_size", h.draft_vocab_size, expected)
        return cls(
            head=h.type,
            mode=cfg.data.mode,
            batch=cfg.train.batch_size,
            length=cfg.data.max_length,
            steps=kind.steps(cfg),
            draft_vocab=h.draft_vocab_size,
            aux_layers=aux,
            options=h.head_options(),
            ttt=kind.ttt,
            memory=kind.memory,
            labels=getattr(h, "labels", "target"),  # a section with a labels key (MTP) says which
            cotrain=c.method if c.enabled else None,
            lora_rank=c.lora_rank,
            lora_modules=tuple(m.strip() for m in c.lora_target_modules.split(",") if m.strip()),
            freeze_embeddings=c.freeze_embeddings,
            self_distill=c.enabled and c.self_distill,
            attention=cfg.train.ttt_attention,
            logit_chunk=cfg.train.logit_chunk,
            checkpointing=cfg.train.activation_checkpointing,
        )


@dataclass(frozen=True)
class Setup:
    """Where it runs: the head's strategy over `world_size` ranks, the device kind and the precision."""

    strategy: str = "single"  # single, ddp, fsdp (FSDP2 full shard), zero1, zero2, zero3
    world_size: int = 1
    device: str = "cuda"  # cuda | cpu
    precision: str = "bf16"  # no (fp32) | bf16 | fp16
    tp: int = 1  # target_placement=tp|ep: the decoder layers split over this many ranks (1 = replicate)
    dense: bool = True  # attention and dense MLPs split over them too (False: ep with attention whole)

    @property
    def mode(self) -> str:
        if self.precision == "no":
            return "fp32"
        return "half" if self.strategy.startswith("zero") else "amp"


@dataclass
class Estimate:
    shapes: TargetShapes
    knobs: Knobs
    setup: Setup
    terms: list[Term]
    head_params: int

    def phase(self, name: str) -> float:
        """Resident and step terms coexist (a sum); batch building's run one after another (the max)."""
        values = [t.bytes for t in self.terms if t.phase == name]
        return (max(values, default=0.0)) if name == "batch" else sum(values)

    @property
    def peak(self) -> float:
        return self.phase("resident") + max(self.phase("batch"), self.phase("step"))

    def largest(self, n: int = 3) -> list[Term]:
        """The biggest terms of the peak: resident ones, and the larger phase's (batch: its largest)."""
        batch = [t for t in self.terms if t.phase == "batch"]
        if self.phase("batch") > self.phase("step"):
            peak = [max(batch, key=lambda t: t.bytes)]
        else:
            peak = [t for t in self.terms if t.phase == "step"]
        terms = [t for t in self.terms if t.phase == "resident"] + peak
        return sorted(terms, key=lambda t: -t.bytes)[:n]


# ---- the estimate ---------------------------------------------------------------------------------------
def estimate(shapes: TargetShapes, knobs: Knobs, setup: Setup, head_params: int | None = None) -> Estimate:
    """Bytes per rank of a run: every term with its formula (see the module docstring)."""
    if head_params is None:
        head_params = head_parameters(shapes, knobs)
    terms = resident_terms(shapes, knobs, setup, head_params)
    terms += MEMORY_TERMS[knobs.memory](shapes, knobs, setup)  # the kind's own terms (objective.memory)
    est = Estimate(shapes, knobs, setup, terms, head_params)
    if setup.device == "cuda":  # CUDA context, NCCL buffers, allocator slack (preflight_bytes.py)
        terms.append(gpu_overheads(est.peak, setup.world_size, setup.tp))
    return est


def resident_terms(s: TargetShapes, k: Knobs, setup: Setup, head_params: int) -> list[Term]:
    whole = s.param_bytes + s.buffer_bytes
    offline = k.mode == "offline" and k.cotrain is None
    # tensor parallel (runtime/core/placement.py): the layers split, embedding + norm + LM head whole per rank
    weights = s.part_bytes if offline else s.part_bytes + (whole - s.part_bytes) / setup.tp
    where = (
        "embedding + final norm + LM head (offline: the parts the batches read)"
        if offline
        else f"layers / {setup.tp} ranks (tensor parallel), embedding + norm + LM head whole"
        if setup.tp > 1
        else "whole on every rank"
    )
    if not offline and not s.arch.dense:  # MoE / MLA: each parameter's own share (preflight_families.py)
        weights = s.arch.weights_per_rank(whole, setup.tp, setup.dense)
        what_if = " (what-if)" if setup.dense and tp_is_what_if(s) else ""  # DeepSeek-V3 refuses tp, not ep
        split = f"; {'TP' if setup.dense else 'experts EP, attention whole,'} split over {setup.tp} ranks"
        where = s.arch.describe() + (split + what_if if setup.tp > 1 else "")
    how = f"{count(s.params)} params x {s.dtype_bytes} B, {where}"
    terms = [Term("target weights", weights, how, "resident")]
    terms += trainable_terms("head", head_params, 4, setup, with_params=True)
    if k.cotrain == "lora":
        terms += trainable_terms("LoRA", lora_parameters(s, k.lora_rank, k.lora_modules), 4, setup, True)
    elif k.cotrain == "full":
        trainable = s.params - (s.embedding_params if k.freeze_embeddings else 0)
        terms += trainable_terms("target", trainable, s.dtype_bytes, setup, with_params=False)
    if k.self_distill and (k.cotrain == "full" or not k.freeze_embeddings):  # train/medusa2.py's teacher
        terms.append(
            Term("original target (frozen copy)", whole, "the self-distillation teacher", "resident")
        )
    return terms


def trainable_terms(label: str, n: int, p: int, setup: Setup, with_params: bool = True) -> list[Term]:
    """Parameters, gradients and AdamW state of `n` trainable parameters of `p` bytes under the strategy.
    DDP keeps a bucket copy of the gradients; FSDP2 gathers parameters (and gradients) whole for compute,
    in half precision under mixed precision; DeepSpeed holds the module in half precision with fp32
    master weights, partitions what its stage says and keeps a reduce bucket (ZeRO-3: parameters
    gathered up to its live-parameter cap)."""
    w, s = setup.world_size, setup.strategy
    g = 2 if setup.precision != "no" else p
    if s in ("single", "ddp"):
        ddp = s == "ddp"
        rows = [
            (p * n, f"{p} B"),
            (p * n * (2 if ddp else 1), f"{p} B" + (" + DDP's bucket copy" if ddp else "")),
            (2 * p * n, f"2 moments x {p} B"),
        ]
    elif s == "fsdp":
        rows = [
            (p * n / w + g * n, f"{p} B / {w} + {g} B gathered"),
            (p * n / w + g * n, f"{p} B / {w} + {g} B unsharded"),
            (2 * p * n / w, f"2 moments x {p} B / {w}"),
        ]
    else:
        stage = int(s[-1])
        bucket = g * min(n, ZERO_BUCKET)
        params = g * n / w + g * min(n, ZERO3_LIVE) if stage == 3 else g * n
        grads = (g * n / w if stage >= 2 else g * n) + bucket
        rows = [
            (params, f"{g} B" + (f" / {w} + gathered (live cap {ZERO3_LIVE:.0e})" if stage == 3 else "")),
            (grads, f"{g} B" + (f" / {w}" if stage >= 2 else "") + f" + reduce bucket ({ZERO_BUCKET:.0e})"),
            (12 * n / w, f"fp32 master + 2 moments: 12 B / {w}"),
        ]
    names = (f"{label} parameters", f"{label} gradients", f"{label} optimizer (AdamW)")
    terms = [Term(name, b, f"{count(n)} x {how}", "resident") for name, (b, how) in zip(names, rows)]
    return terms if with_params else terms[1:]


def target_forward_bytes(s: TargetShapes, mode: str, tp: int, dense: bool = True) -> float:
    """One decoder layer's transient working set per token under no_grad (the larger of a norm's fp32
    copies and the MLP's three [I] tensors), split by tensor parallelism (`dense` False: ep with the
    attention and dense MLPs whole, only the experts split)."""
    b = 4 if mode == "fp32" else s.dtype_bytes
    if not s.arch.dense:  # MoE experts, MLA's expanded keys and values (train/preflight_families.py)
        return s.arch.forward_work(mode, b, s.hidden, tp, dense)
    norm = 2 * b * s.hidden + (0 if mode == "fp32" else 8 * s.hidden)
    mlp = 2 * b * s.hidden + 3 * b * s.intermediate / tp
    return max(norm, mlp)


def eagle3_batch_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """Building an EAGLE-3 batch (train/eagle3_data.py), in sequence: online, the target per row with a
    KV cache, keeping each row's aux and last states; then the rows padded (offline rows pad on the
    host) and the features cast to fp32 for the head."""
    b, tokens = s.dtype_bytes, k.batch * k.length
    a_h, state = len(k.aux_layers) * s.hidden, (len(k.aux_layers) + 1) * s.hidden
    lists = 0 if (k.mode == "offline" and setup.device != "cpu") else tokens * state * b
    terms = []
    if k.mode == "online":
        kv = s.layers * 2 * s.kv_width * b / setup.tp
        width = f"2 x {s.kv_width}"
        if not s.arch.dense:  # MLA's latent cache, KV heads replicated past num_key_value_heads ranks
            kv, width = s.arch.kv_cache_bytes(b, setup.tp, setup.dense), f"{s.arch.cache_width}"
        ws = target_forward_bytes(s, setup.mode, setup.tp, setup.dense)
        row = k.length * (kv + max(ws + b * a_h, 2 * b * a_h + b * s.hidden))
        how = f"per row: KV cache ({s.layers} layers x {width} x {b} B / token), a layer's work"
        terms.append(
            Term("target forward (no_grad)", (k.batch - 1) * k.length * state * b + row, how, "batch")
        )
    padded = lists + tokens * state * b
    cast = tokens * (state * b + (4 * a_h if b != 4 else 0))
    how = f"aux + last states ({b} B), padded; features to fp32"
    terms.append(Term("batch tensors", max(padded, cast), how, "batch"))
    return terms


def decomposed_saved(s: TargetShapes, mode: str, step: int, explicit: int = 0) -> int:
    """The TTT step's attention without a mask (train/ttt_attention.py) per token: the causal kernel's
    q, out and log-sum-exp, the step's own k and v (step 0's are every step's prefix keys), and for
    k >= 1 the merge's softmax weights and, from half inputs, its fp32 copies of q, out and each
    diagonal key and value. `explicit` = T off the CPU (causal_attention_math, the default there): each
    query also keeps its [T] scores and softmax per head, and k, v repeated to every query head."""
    a = act_bytes(mode)
    saved = 2 * a * s.q_width + 4 * s.heads + 2 * a * s.kv_width
    saved += (2 * a * s.heads * explicit + 2 * a * s.q_width) if explicit else 0
    if step == 0:
        return saved
    saved += (step + 1) * 4 * s.heads
    if mode != "fp32":
        saved += 8 * s.q_width + step * 8 * s.kv_width
    return saved


def dense_saved(s: TargetShapes, mode: str, device: str, length: int, step: int) -> float:
    """The reference TTT attention (train.ttt_attention=dense): SDPA over the (k+1)T keys of a cache
    grown by concatenation, with a dense boolean [T, (k+1)T] mask."""
    keys = (step + 1) * length
    mask = 4 * keys if device == "cpu" else 0  # CPU keeps the bool mask as an fp32 additive one
    return kernel_saved(ttt_kernel(s, device), s, mode, length, keys, mask)


def eagle3_step_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One EAGLE-3 micro-batch (train/eagle3_objective.py): its inputs and the target's draft-vocab
    distributions at the positions a loss reads (worst case: all), built `logit_chunk` rows at a time;
    then K unrolled steps of the head, each keeping its layers' activations, its attention's tensors and
    the outputs its chunked soft cross-entropy reads (each chunk's logits are recomputed in backward)."""
    mode, tokens, t, b = setup.mode, k.batch * k.length, k.length, s.dtype_bytes
    a, h, vd = act_bytes(mode), s.hidden, k.draft_vocab
    a_h, layers = len(k.aux_layers) * h, k.options.get("num_layers", 1)
    chunk = min(k.logit_chunk, tokens)
    inputs = tokens * (4 * a_h + b * h + 4 * vd + 30)  # features, last hidden, target probs [N, Vd], ids
    fuse = 0 if mode == "fp32" else 2 * a_h  # fc's half copy of the features
    if k.options.get("fc_norm") or k.options.get("norm_before_fc"):
        fuse += norm_saved(mode, a_h, False)
    internals = (
        norm_saved(mode, h, False)  # input_layernorm(embedding): the embedding needs no gradient
        + norm_saved(mode, h, True)  # hidden_norm(feature)
        + linear_inputs(mode, 2 * h, 3)  # [norm(embedding); norm(feature)] into q/k/v
        + layer_saved(s, mode, count_input=False)
        + (layers - 1) * layer_saved(s, mode, count_input=True)
        + 2 * a * s.head_dim  # rope's cos and sin
    )
    if k.attention == "dense":
        kernels = [tokens * layers * dense_saved(s, mode, setup.device, t, j) for j in range(k.steps)]
        kind = f"dense [T,(k+1)T] mask, {ttt_kernel(s, setup.device)} kernel"
    else:
        explicit = t if k.attention == "decomposed" and setup.device != "cpu" else 0
        kernels = [tokens * layers * decomposed_saved(s, mode, j, explicit) for j in range(k.steps)]
        kind = ("explicit [T,T] scores" if explicit else "a fused causal kernel") + " + k diagonal keys"
    loss = tokens * k.steps * a * h  # the counted outputs each step's chunked cross-entropy reads
    saved, attention = tokens * (fuse + k.steps * internals), sum(kernels)
    recompute = 0.0
    if k.checkpointing:  # each step keeps its inputs, output and cache entries; one step is recomputed
        kept = b * h + 8 + a * h + 2 * a * s.kv_width * layers
        saved, attention = tokens * (fuse + k.steps * kept), 0.0
        recompute = 2 * (tokens * internals + kernels[-1])  # its tensors and their gradients
    math = k.attention == "dense" and ttt_kernel(s, setup.device) == "math"
    largest = 4 * s.heads * k.steps * t if math else 0  # the last step's fp32 scores
    logits = chunk * ((b + (4 if b != 4 else 0)) * s.vocab + 8 * vd)  # [C, V] logits (+ fp32), [C, Vd] probs
    working = max(
        chunk * (12 * h + 16 * vd),  # a cross-entropy chunk recomputed: logits, targets, log-softmax, product
        tokens * 2 * max(largest, a * s.intermediate),  # backward's first gradients
        recompute,
    )
    how = f"before the unroll: the inputs and {chunk}-row chunks of [., V] logits (train.logit_chunk)"
    return [
        Term("target distributions", inputs + logits, how, "batch"),
        Term(
            "inputs: features, target probs", inputs, f"B x T x (A*H fp32 + H + Vd fp32), Vd = {vd}", "step"
        ),
        Term(
            "head activations (B x T x K)",
            saved,
            f"{k.steps} steps x {layers} layer(s): norms, q/k/v/o inputs, MLP [I]",
            "step",
        ),
        Term("attention", attention, f"{kind}, {k.steps} steps", "step"),
        Term("loss inputs", loss, "K x B x T x H: outputs the chunked soft cross-entropy reads", "step"),
        Term("working set", working, "a cross-entropy chunk recomputed, backward's first gradients", "step"),
    ]


def target_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """The target inside an MTP or Medusa step: online, its forward under no_grad (the frozen target's,
    or a co-trained one's teacher); co-trained, every layer's activations and its next-token loss."""
    mode, tokens, t = setup.mode, k.batch * k.length, k.length
    h, v, b, cotrain = s.hidden, s.vocab, s.dtype_bytes, k.cotrain is not None
    terms = []
    if k.mode == "online" and (not cotrain or k.self_distill):  # the frozen target's or the teacher's
        ws = tokens * (target_forward_bytes(s, mode, setup.tp, setup.dense) + 2 * b * h + t)  # + bool mask
        terms.append(Term("target forward (no_grad)", ws, "a layer's working set, [B,1,T,T] mask", "batch"))
    if cotrain:  # the target runs with gradients: every layer keeps its activations
        per_layer = layer_saved(s, "half" if mode != "fp32" else mode, True, s.qk_norm) + kernel_saved(
            "flash", s, mode, t, t
        )
        target = tokens * (s.layers * per_layer + norm_saved(mode, h, True) + 4 * v)
        how = f"{s.layers} layers with gradients + next-token loss"
        terms.append(Term("target activations (co-training)", target, how, "step"))
    return terms


def mtp_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One MTP micro-batch (train/heads.py MtpModel, train/mtp_objective.py): the target's last hidden
    states and its logits at every supervised position (worst case: all), then per module the block's
    activations and the soft cross-entropy over the full vocabulary."""
    mode, tokens, t = setup.mode, k.batch * k.length, k.length
    a, h, v, b = act_bytes(mode), s.hidden, s.vocab, s.dtype_bytes
    cotrain = k.cotrain is not None
    teacher = tokens * (b * v + (4 * v if b != 4 else 0) + 2 * b * h)  # logits (dtype, fp32), h_0, pre-norm
    terms = target_terms(s, k, setup)
    per_module, attention = 0.0, 0.0
    for m in range(k.steps):
        per_module += norm_saved(mode, h, False) + norm_saved(mode, h, m > 0 or cotrain)  # enorm, hnorm
        per_module += (
            linear_inputs(mode, 2 * h, 1) + layer_saved(s, mode, True, s.qk_norm) + 2 * a * s.head_dim
        )
        per_module += norm_saved(mode, h, True) + linear_inputs(mode, h, 1)  # shared_head.norm into lm_head
        if m == 0:  # causal, no mask: flash with GQA
            attention += tokens * kernel_saved("flash", s, mode, t, t)
        else:  # module_mask [T, T]: transformers repeats k/v; CPU keeps the mask in fp32
            mask = (4 if setup.device == "cpu" else a) * t / k.batch
            attention += tokens * kernel_saved("repeated", s, mode, t, t, mask)
    loss = tokens * k.steps * (8 if k.labels == "target" else 4) * v
    working = tokens * (4 + (b if b != 4 else 0) + 4) * v  # the last module's logits and teacher rows
    return terms + [
        Term("teacher: target logits, h_0", teacher, f"B x T x V ({b} B + fp32), V = {v}", "step"),
        Term(
            "module activations (B x T x M)",
            tokens * per_module,
            f"{k.steps} module(s): norms, eh_proj, block",
            "step",
        ),
        Term("attention", attention, "flash (module 0), masked (modules >= 1)", "step"),
        Term("loss tensors", loss, "M x B x T x V x fp32 (log-softmax, target probs)", "step"),
        Term("working set", working, "the last module's logits", "step"),
    ]


def medusa_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One Medusa micro-batch (train/medusa_objective.py): the target's last state h and its logits at
    every supervised position (worst case: all), then K heads on that one state, each its residual
    blocks' activations and a cross-entropy over the draft vocabulary Vd (head.reduce_vocab, else V):
    no attention, nothing per head from the target. A shared LM head's Vd rows are sliced once while the
    target is frozen (runtime/heads/medusa.py draft_rows); co-trained (Medusa-2), once per head in the
    graph, with each head's input saved for the rows' gradient."""
    mode, tokens = setup.mode, k.batch * k.length
    a, h, v, b = act_bytes(mode), s.hidden, s.vocab, s.dtype_bytes
    vd = k.options.get("draft_vocab_size") or v
    shared, layers = k.options.get("original_lm_head", True), k.options.get("num_layers", 1)
    cotrain = k.cotrain is not None
    p = 2 if mode == "half" else 4  # the heads' dtype: float32, DeepSpeed's bf16 module under "half"
    terms = target_terms(s, k, setup)
    if shared and vd < v:
        rows = Term("draft rows of the LM head", vd * h * b, f"Vd x H x {b} B, sliced once", "resident")
        if cotrain:
            rows = Term(rows.name, k.steps * vd * h * b, f"K x Vd x H x {b} B, sliced per head", "step")
        terms.append(rows)
    state = b * h + (p * h if p != b else 0) + (b * h if k.mode == "offline" else 0)  # h, its cast, capture
    teacher = tokens * (state + b * v + (4 * v if b != 4 else 0))  # + the [N, V] logits (dtype, fp32)
    first = linear_inputs(mode, h, 1) if layers and mode == "amp" else 0  # autocast's copy of h per head
    blocks = first + layers * a * h + max(layers - 1, 0) * linear_inputs(mode, h, 1)  # SiLU, linear inputs
    own = not shared or cotrain  # the LM head's input is saved for its weight's gradient
    soft = 8 if k.labels == "target" else 4  # log-softmax (+ the target's probabilities), fp32
    loss = soft * vd + 8 + (linear_inputs(mode, h, 1) if own else 0)  # + the gathered positions
    working = tokens * (4 * v + 4 * vd + (4 + (a if a != 4 else 0)) * vd)  # the last head's rows, logits
    words = f"Vd x fp32 ({'log-softmax, target probs' if soft == 8 else 'log-softmax'})"
    words += f", Vd = {vd} (head.reduce_vocab)" if vd < v else f", Vd = V = {v}"
    fp32 = " + fp32" if b != 4 else ""
    return terms + [
        Term("teacher: target logits, h", teacher, f"B x T x (H + V) ({b} B{fp32}), V = {v}", "step"),
        Term(
            "head activations (B x T x K)",
            tokens * k.steps * (blocks + p * h),  # + each head's output in the [K, B, T, H] stack
            f"{k.steps} head(s) x {layers} residual block(s): linear and SiLU inputs, outputs",
            "step",
        ),
        Term("loss tensors", tokens * k.steps * loss, f"K x B x T x {words}", "step"),
        Term("working set", working, "the last head's teacher rows and draft logits", "step"),
    ]


def eagle3_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    if k.cotrain is not None:  # train/eagle3_cotrain.py: the target runs in the step, with gradients
        batch = [t for t in eagle3_batch_terms(s, k, setup) if t.name != "target forward (no_grad)"]
        return target_terms(s, k, setup) + batch + eagle3_step_terms(s, k, setup)
    return eagle3_batch_terms(s, k, setup) + eagle3_step_terms(s, k, setup)


def dflash_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One DFlash micro-batch: EAGLE-3's batch (the same inputs), then Q = B x anchors x S block queries
    through the draft layers (Qwen3 layers: q/k norms) over T + Q keys with a dense boolean mask (fp32 on
    CPU), the teacher's draft-vocab distributions at every position and the loss over the Q rows."""
    o = k.options
    size, layers, anchors = o.get("block_size", 16), o.get("num_layers", 1), o.get("max_anchors", 32)
    queries, a = k.batch * min(anchors, k.length) * size, act_bytes(setup.mode)
    keys = k.length + queries // k.batch
    per_layer = layer_saved(s, setup.mode, True, qk_norm=True) + 2 * a * s.q_width + 4 * s.heads
    mask = queries * keys * (4 if setup.device == "cpu" else 1)
    vd = k.draft_vocab
    return eagle3_batch_terms(s, k, setup) + [
        Term(
            "block activations",
            queries * layers * per_layer,
            f"{queries} queries x {layers} layer(s)",
            "step",
        ),
        Term("block attention mask", mask, f"Q x (T + Q/B) = {queries} x {keys}", "step"),
        Term("teacher distributions", k.batch * k.length * 4 * vd, f"B x T x Vd fp32, Vd = {vd}", "step"),
        Term("loss tensors", queries * 12 * vd, "Q x Vd: logits, log-softmax, targets (fp32)", "step"),
    ]


# The terms of each kind's `memory` (its objective declares it, train/objectives.py); a kind whose memory
# differs from these adds its own.
MEMORY_TERMS = {"ttt": eagle3_terms, "modules": mtp_terms, "heads": medusa_terms, "blocks": dflash_terms}
