"""The memory preflight: bytes per rank a training run will need, estimated from the target's config.json.

    shapes = TargetShapes.load("meta-llama/Llama-3.3-70B-Instruct", torch.bfloat16)  # shapes.py
    knobs = Knobs.from_config(cfg, shapes)                          # B, T, K, head, mode, ... of a config
    est = estimate(shapes, knobs, Setup("zero2", world_size=8))    # per rank: est.peak, est.terms

Nothing loads: the target and the head are built on the meta device (`torch.device("meta")`) from the
config alone, so parameter bytes are exact per dtype. The rest counts, tensor by tensor and per token,
what the trainer's code keeps. This module counts what every kind's run holds (the resident terms); the
kind declares the rest: its objective's `memory_terms(shapes, knobs, setup)` (train/objectives/registry.py),
written in the kind's own file (train/preflight/eagle3_memory.py: EAGLE-3's and P-EAGLE's unroll,
mtp_memory.py: MTP's modules, medusa_memory.py: Medusa's heads, dflash_memory.py: DFlash's blocks;
target_memory.py: the target inside a step), which `estimate` adds:

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
offline run yet to capture adds a capture phase (train/preflight/capture.py). Every position supervised,
rows at full length (the worst case). `Setup.tp` > 1: a group of that many ranks (runtime/core/placement.py:
`tp`, or `ep` with `Setup.dense` False: only the experts split). Activation dtypes: "fp32" (CPU), "amp"
(autocast over float32 parameters: DDP/FSDP on GPUs), "half" (DeepSpeed's bf16 module). Estimates; GB are
1e9 bytes. MoE and MLA targets: weights, KV cache and working set from train/preflight/families.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.runtime.errors import BadInputError
from draftsmith.train.preflight.families import tp_is_what_if
from draftsmith.train.preflight.shapes import TargetShapes, head_parameters, lora_parameters
from draftsmith.train.preflight.units import Term, count, gpu_overheads

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
        from draftsmith.train.objectives.registry import objective

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
    from draftsmith.train.objectives.registry import objective

    if head_params is None:
        head_params = head_parameters(shapes, knobs)
    terms = resident_terms(shapes, knobs, setup, head_params)
    terms += objective(knobs.head).memory_terms(shapes, knobs, setup)  # what the kind declares
    est = Estimate(shapes, knobs, setup, terms, head_params)
    if setup.device == "cuda":  # CUDA context, NCCL buffers, allocator slack (units.py)
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
    if not offline and not s.arch.dense:  # MoE / MLA: each parameter's own share (families.py)
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
    # train/objectives/medusa2.py's teacher
    if k.self_distill and (k.cotrain == "full" or not k.freeze_embeddings):
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
