"""The training config: dataclasses are the schema, YAML files under configs/ are instances.

    cfg = load_train_config("configs/eagle3-smollm2-135m.yaml", ["train.max_steps=20", "output_dir=runs/x"])

Loading is strict (unknown keys and wrong types are errors naming the dotted key) and `validate` checks
every value a run depends on before anything heavy starts. docs/architecture.md (section 4) names three
override keys every train config accepts: `output_dir`, `train.max_steps`, `data.max_samples`.

The co-training weights are the kind's own keys, in its `head:` section (`head.cotrain_weight`, ...:
runtime/heads/head_kind.py CotrainSection). A config written before that (`cotrain.mtp_weight`,
`cotrain.eagle3_weight`, `cotrain.medusa_weight`, ...) still loads: `move_cotrain_keys` reads each as the
new key of its kind, with a warning naming the new place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from draftsmith.runtime.core.config import apply_override, from_dict, read_yaml
from draftsmith.runtime.errors import BadInputError, Needs, check_needs, check_output_dir
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.head_kind import HeadSection

log = logging.getLogger("draftsmith")


def default_head() -> HeadSection:
    return head_kinds.get(head_kinds.DEFAULT_KIND).section()


@dataclass
class CotrainConfig:
    """Train the target with the head, for kinds that allow it (runtime/heads/head_kinds.py, `cotrain=True`):
    how the target trains. The draft loss's weight is the kind's own `head.cotrain_weight`: MTP, loss =
    L_next + w * sum_m decay**m L_m; Medusa-2 (train/objectives/medusa2.py), loss = L_LM + lambda0 * sum_k
    decay**k CE_k (Cai et al. 2024, arXiv:2401.10774 section 2.3.2); EAGLE-3
    (train/objectives/eagle3_cotrain.py), loss = L_next + w * sum_k decay**k L_k (the TTT loss)."""

    enabled: bool = False
    method: Literal["lora", "full"] = "lora"  # LoRA adapters (peft, merged at export) or every weight
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    freeze_embeddings: bool = True  # keep the embedding and the LM head (tied in SmolLM2) as they were
    # Medusa-2 self-distillation, for data whose answers are not the target's own: the target's loss is
    # KL(original || target) per position instead of CE on the data; the original is the target with its
    # LoRA adapters off, or a frozen copy (full, or freeze_embeddings=false: the weights once more in memory)
    self_distill: bool = False
    # The target's weights train at train.lr * target_lr_ratio, the head's at train.lr (Medusa-2's
    # differential learning rates: heads faster than the target); 1 = one learning rate for all
    target_lr_ratio: float = 1.0


@dataclass
class DataConfig:
    source: str = "sharegpt"  # `draftsmith data prepare --source` values
    max_samples: int | None = 2000  # conversations read (None = all)
    max_length: int = 1024  # tokens per row (longer rows are clipped)
    validation_fraction: float = 0.02
    seed: int = 0  # the prepare step's split seed
    mode: Literal["online", "offline"] = "online"  # target in the step, or `data capture` shards
    # offline capture storage (data capture --storage-dtype); fp8: aux states e4m3 with per-token scales
    storage_dtype: Literal["bfloat16", "float16", "float32", "fp8"] = "bfloat16"
    fp8_last_hidden: bool = False  # with fp8: the last hidden state in fp8 too (else bfloat16)
    fp8_bf16_layers: list[int] = field(default_factory=list)  # with fp8: aux layer ids kept in bfloat16
    dir: str | None = None  # where data steps write; None = ~/.cache/draftsmith/data/<inputs hash>
    # enable_thinking of Qwen3-style chat templates (`data prepare --thinking`); None = the template's own
    thinking: Literal["on", "off"] | None = None


@dataclass
class LoopConfig:
    max_steps: int = 1000  # optimizer steps
    batch_size: int = 4  # rows per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-4
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.95)
    max_grad_norm: float = 0.5
    ttt_steps: int = 7  # training-time-test unroll depth K
    step_decay: float = 0.8  # loss weight decay**k of step k
    noise_std: float = 0.0  # EAGLE-3: N(0, std^2) on the aux features the head reads, training only (0 = off)
    # The TTT step's memory (train/objectives/eagle3_objective.py); none of these changes the loss beyond
    # rounding. decomposed: causal attention over the step-0 keys + k diagonal keys, merged by log-sum-exp
    # (the causal part: the CPU flash kernel on a CPU, the explicit scores on a GPU: what CI runs); dense: the
    # reference, one SDPA over (k+1)T keys with a [T, (k+1)T] mask; flex: decomposed with FlexAttention
    # compiled for the causal part, CUDA only, never run in CI (scripts/gpu_check.sh measures it).
    ttt_attention: Literal["decomposed", "dense", "flex"] = "decomposed"
    logit_chunk: int = 1024  # rows per chunk of the target's logits and of the soft cross-entropy
    activation_checkpointing: bool = False  # recompute the head's layers in backward, per TTT step
    seed: int = 0  # head init and data order
    # Length bucketing: 0 = off; N = sort each window of N micro-batches' rows by length (less padding,
    # every row still once per epoch, exact resume). Data loading: DataLoader workers read (and, offline,
    # collate) micro-batches ahead of the step, in order; 0 = in the training process.
    bucket_batches: int = 0
    loader_workers: int = 0
    loader_prefetch: int = 2  # micro-batches each worker reads ahead
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    allow_world_size_change: bool = False  # resume a checkpoint written by another number of processes
    allow_data_change: bool = False  # resume a checkpoint written for other data
    # The memory preflight (train/preflight/estimate.py), before the target loads: "check" refuses a run whose
    # estimated bytes per rank exceed the device's memory (exit 2), "warn" logs and goes on, "off" skips.
    preflight: Literal["check", "warn", "off"] = "check"
    preflight_device_gb: float | None = None  # memory per rank; None = the GPU's free memory (CPU: RAM)
    # seconds any collective waits (NCCL and gloo alike; NCCL's default is 600), the barriers where ranks
    # wait for the data steps included: a wait that runs out ends the run naming the data commands
    process_group_timeout_s: int = 1800


@dataclass
class EvalConfig:
    every: int = 100  # steps between evaluations (0 = only at the end)
    max_rows: int = 64  # validation rows per evaluation


@dataclass
class CheckpointConfig:
    every: int = 100  # steps between checkpoints (0 = only at the end)
    keep: int = 2  # newest checkpoints kept (older ones are deleted)
    resume: Literal["auto", "never"] = "auto"  # auto: continue from the newest checkpoint in output_dir


@dataclass
class LogConfig:
    every: int = 10  # steps between metrics.jsonl / tracker rows
    tracker: Literal["none", "wandb", "tensorboard"] = "none"  # wandb runs offline without an API key
    project: str = "draftsmith"
    progress: bool = True  # the tqdm bar


def _offline_only(key: str, unset: tuple) -> Needs:
    return Needs(
        f"data.{key}",
        "data.mode=offline",
        lambda c: getattr(c.data, key),
        lambda c: c.data.mode == "offline",
        unset,
    )


# Keys that act only in one mode (runtime/errors.py Needs): set without it, refused naming it.
NEEDS = (
    _offline_only("storage_dtype", ("bfloat16",)),  # the capture's storage: online steps run the target
    _offline_only("fp8_last_hidden", (False,)),
    _offline_only("fp8_bf16_layers", ([],)),
    Needs(
        "train.activation_checkpointing",
        "train.ttt_attention=decomposed (or flex)",
        lambda c: c.train.activation_checkpointing,
        lambda c: c.train.ttt_attention != "dense",
    ),
)


@dataclass
class TrainConfig:
    target: str = "smollm2-135m"  # alias, folder, Hub id or .gguf
    output_dir: str = "runs/eagle3"
    device: str = "auto"
    dtype: str = "auto"  # the target's compute dtype
    # The frozen target across processes (runtime/core/placement.py): replicate = whole on every rank; tp =
    # each decoder layer split over the tp_size ranks of a group (None: all of them); ep = a MoE target's
    # experts split over the ep_size ranks of a group (attention split where the heads allow, else whole).
    # The head trains data-parallel over the world / group groups. Online training and the capture inside
    # the job (offline reads parts).
    target_placement: Literal["replicate", "tp", "ep"] = "replicate"
    tp_size: int | None = None
    ep_size: int | None = None
    # `head:` is the section of the kind `head.type` names (runtime/heads/eagle3_kind.py Eagle3Section,
    # runtime/heads/mtp_kind.py MtpSection, ...): that kind's keys only
    head: HeadSection = field(default_factory=default_head, metadata={"section": head_kinds.section_class})
    cotrain: CotrainConfig = field(default_factory=CotrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def _validate_storage(self) -> None:
        """fp8 captures need a torch with float8 dtypes; data.fp8_last_hidden needs fp8 (capture_storage)."""
        from draftsmith.data_recipes.capture_storage import check_storage

        try:
            check_storage(self.data.storage_dtype, self.data.fp8_last_hidden, self.data.fp8_bf16_layers)
        except BadInputError as err:  # `--storage-dtype` -> `data.storage_dtype`
            field_name = "data." + err.field.removeprefix("--").replace("-", "_")
            raise BadInputError(field_name, err.got, err.expected, err.hint) from None

    def validate(self) -> TrainConfig:
        t = self.train
        positive = {
            "train.max_steps": t.max_steps,
            "train.batch_size": t.batch_size,
            "train.grad_accum": t.grad_accum,
            "train.ttt_steps": t.ttt_steps,
            "train.logit_chunk": t.logit_chunk,
            "data.max_length": self.data.max_length,
            "log.every": self.log.every,
            "checkpoint.keep": self.checkpoint.keep,
            "eval.max_rows": self.eval.max_rows,
        }
        if self.data.max_samples is not None:
            positive["data.max_samples"] = self.data.max_samples
        for key, value in positive.items():
            if value < 1:
                raise BadInputError(key, value, "an integer >= 1")
        for key, value in {"eval.every": self.eval.every, "checkpoint.every": self.checkpoint.every}.items():
            if value < 0:
                raise BadInputError(key, value, "an integer >= 0 (0 = only at the end)")
        if not (0 < t.lr < 1):
            raise BadInputError("train.lr", t.lr, "a learning rate in (0, 1)")
        if t.warmup_steps < 0:  # longer than max_steps is allowed: smoke runs shrink max_steps only
            raise BadInputError("train.warmup_steps", t.warmup_steps, "an integer >= 0")
        if not 0 <= t.min_lr_ratio <= 1:
            raise BadInputError("train.min_lr_ratio", t.min_lr_ratio, "a number in [0, 1]")
        if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
            raise BadInputError("train.betas", list(t.betas), "two numbers in [0, 1)")
        if not t.max_grad_norm > 0:
            raise BadInputError("train.max_grad_norm", t.max_grad_norm, "a number > 0")
        if not 0 < t.step_decay <= 1:
            raise BadInputError("train.step_decay", t.step_decay, "a number in (0, 1]")
        if t.weight_decay < 0:
            raise BadInputError("train.weight_decay", t.weight_decay, "a number >= 0")
        if t.preflight_device_gb is not None and not t.preflight_device_gb > 0:
            raise BadInputError("train.preflight_device_gb", t.preflight_device_gb, "a number of GB > 0")
        if t.process_group_timeout_s < 1:
            raise BadInputError("train.process_group_timeout_s", t.process_group_timeout_s, "seconds >= 1")
        loading = {"train.bucket_batches": t.bucket_batches, "train.loader_workers": t.loader_workers}
        for key, value in loading.items():
            if value < 0:
                raise BadInputError(key, value, "an integer >= 0 (0 = off)")
        if t.loader_prefetch < 1:
            raise BadInputError("train.loader_prefetch", t.loader_prefetch, "an integer >= 1")
        self._validate_head()
        # head.loss, ttt_schedule, ttt_weights, noise
        from draftsmith.train.objectives.eagle3_levers import check_config

        check_config(self)
        self._validate_placement()
        if not 0 <= self.data.validation_fraction < 1:
            raise BadInputError(
                "data.validation_fraction", self.data.validation_fraction, "a number in [0, 1)"
            )
        check_needs(self, NEEDS)
        self._validate_storage()
        check_output_dir("output_dir", self.output_dir)  # a file there fails now, not after the data steps
        return self

    def _validate_placement(self) -> None:
        """What the config alone decides; the target's heads and the world size are checked when the run
        starts (runtime/placement.check_placement)."""
        for key, placement in (("tp_size", "tp"), ("ep_size", "ep")):
            size = getattr(self, key)
            if size is not None and size < 1:
                raise BadInputError(key, size, "an integer >= 1 (unset: the number of processes)")
            if self.target_placement != placement and size not in (None, 1):
                raise BadInputError(
                    key, size, f"unset with target_placement={self.target_placement} (or set {placement})"
                )
        if self.target_placement != "replicate" and self.cotrain.enabled:
            raise BadInputError(
                "target_placement",
                self.target_placement,
                "replicate with cotrain.enabled (a co-trained target is trained whole)",
            )

    def _validate_head(self) -> None:
        """The head section against the rest (its own keys it checked when it loaded), and co-training."""
        kind = head_kinds.get(self.head.type)
        self.head.validate()  # a section built in code (not from YAML) is checked here too
        self.head.check_run(self)
        c = self.cotrain
        if not c.enabled:
            return
        if not kind.cotrain:
            allowed = [k.name for k in head_kinds.KINDS.values() if k.cotrain]
            raise BadInputError(
                "cotrain.enabled",
                True,
                f"false for head.type={kind.name} (co-training is for {', '.join(allowed)})",
            )
        if self.data.mode != "online":
            raise BadInputError(
                "cotrain.enabled",
                True,
                "data.mode=online (captured features come from a frozen target; a co-trained one changes)",
            )
        if self.target.endswith(".gguf"):
            raise BadInputError(
                "target",
                self.target,
                "a trainable checkpoint (a .gguf is a quantized export; co-train the HF one)",
            )
        if c.method == "lora" and (c.lora_rank < 1 or c.lora_alpha < 1 or not 0 <= c.lora_dropout < 1):
            raise BadInputError(
                "cotrain.lora_rank/lora_alpha/lora_dropout",
                [c.lora_rank, c.lora_alpha, c.lora_dropout],
                "rank >= 1, alpha >= 1, dropout in [0, 1)",
            )
        if not c.target_lr_ratio > 0:
            raise BadInputError("cotrain.target_lr_ratio", c.target_lr_ratio, "a number > 0")


def load_train_config(path, overrides=()) -> TrainConfig:
    """A YAML file (or None: the defaults) and `a.b=value` overrides -> a checked TrainConfig."""
    data = read_yaml(path) if path is not None else {}
    for item in overrides:
        apply_override(data, item)
    move_cotrain_keys(data)
    return from_dict(TrainConfig, data).validate()


# The co-training weights that were `cotrain:` keys: old key -> (its kind, its key in that kind's head:)
MOVED_TO_HEAD = {
    "mtp_weight": ("mtp", "cotrain_weight"),
    "eagle3_weight": ("eagle3", "cotrain_weight"),
    "eagle3_detach_features": ("eagle3", "cotrain_detach_features"),
    "medusa_weight": ("medusa", "cotrain_weight"),
    "medusa_weight_warmup_steps": ("medusa", "cotrain_weight_warmup_steps"),
    "medusa_weight_schedule": ("medusa", "cotrain_weight_schedule"),
}


def move_cotrain_keys(data: dict) -> None:
    """A config (mapping) written before the co-training weights moved into the kind's `head:` section:
    each old `cotrain.KEY` of the config's kind becomes its new `head.KEY`, one of another kind (which never
    acted: a resolved config lists them all) is dropped, both with a warning naming the new place. An old
    key and its new one both set, to different values, is an error."""
    cotrain, head = data.get("cotrain"), data.get("head")
    old = [key for key in MOVED_TO_HEAD if isinstance(cotrain, dict) and key in cotrain]
    if not old or not isinstance(head if head is not None else {}, dict):
        return
    head = data.setdefault("head", {})
    kind = head.get("type", head_kinds.DEFAULT_KIND)
    moved, dropped = [], []
    for key in old:
        owner, new = MOVED_TO_HEAD[key]
        value = cotrain.pop(key)
        if owner != kind:
            dropped.append(f"cotrain.{key} (now head.{new} of head.type={owner})")
            continue
        if new in head and head[new] != value:
            raise BadInputError(f"cotrain.{key}", value, f"unset: it is head.{new} now, set to {head[new]!r}")
        head[new] = value
        moved.append(f"cotrain.{key} -> head.{new}")
    log.warning(
        "train config: the co-training weights are the kind's own head: keys now; read %s%s",
        ", ".join(moved) or "none of them",
        f"; ignored {', '.join(dropped)}" if dropped else "",
    )
