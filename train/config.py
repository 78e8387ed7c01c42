"""The training config: dataclasses are the schema, YAML files under configs/ are instances.

    cfg = load_train_config("configs/eagle3-smollm2-135m.yaml", ["train.max_steps=20", "output_dir=runs/x"])

Loading is strict (unknown keys and wrong types are errors naming the dotted key) and `validate` checks
every value a run depends on before anything heavy starts. docs/architecture.md (section 4) names three
override keys every train config accepts: `output_dir`, `train.max_steps`, `data.max_samples`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from draftsmith.runtime.config import load_config
from draftsmith.runtime.errors import BadInputError, check_output_dir


@dataclass
class HeadConfig:
    type: Literal["eagle3", "mtp"] = "eagle3"
    draft_vocab_size: int = 8192  # EAGLE-3: rows of the draft LM head (the most frequent supervised tokens)
    aux_layers: str = "auto"  # auto = (1, L/2-1, L-4), or comma-separated 0-based layer ids
    init_from_target: bool = True  # start lm_head (draft rows) and norm from the target's
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm per aux hidden state before fc
    norm_before_fc: bool = False  # EAGLE-3.1: one RMSNorm over the concatenated aux states before fc
    num_layers: int = 1  # EAGLE-3: draft decoder layers (the first reads [embedding; feature])
    norm_output: bool = False  # EAGLE-3.1: feed the final-normed output back across TTT steps
    num_modules: int = 1  # MTP: depth M, module m predicts token t+m+2 (1..4)
    labels: Literal["target", "data"] = "target"  # MTP: the target's distributions, or the data's tokens
    # MTP input conventions (runtime/mtp.py): h_0 after the target's final norm (DeepSeek) or before it
    # (pre_norm: what vLLM's MiMo model feeds, for `export --format mtp-mimo`), and vLLM's zeroed
    # embedding at position 0.
    mtp_feature: Literal["final_norm", "pre_norm"] = "final_norm"
    mtp_mask_first_position: bool = False


@dataclass
class CotrainConfig:
    """MTP only: train the target with its modules, loss = L_next + mtp_weight * sum_m decay**m L_m."""

    enabled: bool = False
    method: Literal["lora", "full"] = "lora"  # LoRA adapters (peft, merged at export) or every weight
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    freeze_embeddings: bool = True  # keep the embedding and the LM head (tied in SmolLM2) as they were
    mtp_weight: float = 0.3  # lambda (DeepSeek-V3: 0.3 early in pretraining)


@dataclass
class DataConfig:
    source: str = "sharegpt"  # `draftsmith data prepare --source` values
    max_samples: int | None = 2000  # conversations read (None = all)
    max_length: int = 1024  # tokens per row (longer rows are clipped)
    validation_fraction: float = 0.02
    seed: int = 0  # the prepare step's split seed
    mode: Literal["online", "offline"] = "online"  # target in the step, or `data capture` shards
    storage_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"  # offline capture storage
    dir: str | None = None  # where data steps write; None = ~/.cache/draftsmith/data/<inputs hash>


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
    # The TTT step's memory (train/eagle3_objective.py); none of these changes the loss beyond rounding.
    # decomposed: causal attention over the step-0 keys + k diagonal keys, merged by log-sum-exp; dense:
    # the reference, one SDPA over (k+1)T keys with a [T, (k+1)T] mask.
    ttt_attention: Literal["decomposed", "dense"] = "decomposed"
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
    # The memory preflight (train/preflight.py), before the target loads: "check" refuses a run whose
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


@dataclass
class TrainConfig:
    target: str = "smollm2-135m"  # alias, folder, Hub id or .gguf
    output_dir: str = "runs/eagle3"
    device: str = "auto"
    dtype: str = "auto"  # the target's compute dtype
    # The frozen target across processes (runtime/placement.py): replicate = whole on every rank; tp = each
    # decoder layer split over the tp_size ranks of a group (None: all of them), the head data-parallel
    # over the world / tp_size groups. Online training and the capture inside the job (offline reads parts).
    target_placement: Literal["replicate", "tp"] = "replicate"
    tp_size: int | None = None
    head: HeadConfig = field(default_factory=HeadConfig)
    cotrain: CotrainConfig = field(default_factory=CotrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> TrainConfig:
        t = self.train
        positive = {
            "train.max_steps": t.max_steps,
            "train.batch_size": t.batch_size,
            "train.grad_accum": t.grad_accum,
            "train.ttt_steps": t.ttt_steps,
            "train.logit_chunk": t.logit_chunk,
            "head.draft_vocab_size": self.head.draft_vocab_size,
            "head.num_layers": self.head.num_layers,
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
        if t.activation_checkpointing and t.ttt_attention == "dense":
            raise BadInputError(
                "train.activation_checkpointing", True, "false with train.ttt_attention=dense (decomposed)"
            )
        if t.process_group_timeout_s < 1:
            raise BadInputError("train.process_group_timeout_s", t.process_group_timeout_s, "seconds >= 1")
        loading = {"train.bucket_batches": t.bucket_batches, "train.loader_workers": t.loader_workers}
        for key, value in loading.items():
            if value < 0:
                raise BadInputError(key, value, "an integer >= 0 (0 = off)")
        if t.loader_prefetch < 1:
            raise BadInputError("train.loader_prefetch", t.loader_prefetch, "an integer >= 1")
        self._validate_mtp()
        self._validate_placement()
        if not 0 <= self.data.validation_fraction < 1:
            raise BadInputError(
                "data.validation_fraction", self.data.validation_fraction, "a number in [0, 1)"
            )
        check_output_dir("output_dir", self.output_dir)  # a file there fails now, not after the data steps
        return self

    def _validate_placement(self) -> None:
        """What the config alone decides; the target's heads and the world size are checked when the run
        starts (runtime/placement.check_placement)."""
        if self.tp_size is not None and self.tp_size < 1:
            raise BadInputError("tp_size", self.tp_size, "an integer >= 1 (unset: the number of processes)")
        if self.target_placement == "replicate" and self.tp_size not in (None, 1):
            raise BadInputError("tp_size", self.tp_size, "unset with target_placement=replicate (or set tp)")
        if self.target_placement == "tp" and self.cotrain.enabled:
            raise BadInputError(
                "target_placement",
                "tp",
                "replicate with cotrain.enabled (a co-trained target is trained whole)",
            )

    def _validate_mtp(self) -> None:
        from draftsmith.runtime.mtp import MAX_MODULES

        for key, default in (("mtp_feature", "final_norm"), ("mtp_mask_first_position", False)):
            if self.head.type != "mtp" and getattr(self.head, key) != default:
                raise BadInputError(f"head.{key}", getattr(self.head, key), f"{default} (an MTP option)")
        for key, default in (("num_layers", 1), ("norm_output", False)):
            if self.head.type == "mtp" and getattr(self.head, key) != default:
                raise BadInputError(f"head.{key}", getattr(self.head, key), f"{default} (an EAGLE-3 option)")
        if not 1 <= self.head.num_modules <= MAX_MODULES:
            raise BadInputError(
                "head.num_modules", self.head.num_modules, f"an integer in [1, {MAX_MODULES}]"
            )
        c = self.cotrain
        if not c.enabled:
            return
        if self.head.type != "mtp":
            raise BadInputError(
                "cotrain.enabled", True, "false for head.type=eagle3 (co-training is for MTP)"
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
        if not c.mtp_weight > 0:
            raise BadInputError("cotrain.mtp_weight", c.mtp_weight, "a number > 0")


def load_train_config(path, overrides=()) -> TrainConfig:
    return load_config(TrainConfig, path, list(overrides)).validate()
