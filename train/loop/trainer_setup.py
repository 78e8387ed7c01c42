"""What a training run is built from, in the order Trainer.__init__ (train/loop/trainer.py) builds it: the
Accelerator and the run's seed, the memory preflight, the head's inputs checked against the loaded target,
the sample order, and the prepared model with its optimizer and learning-rate schedule.

    acc, precision = start_accelerator(cfg, log_with)   # process group, precision, seed; quiet ranks > 0
    check_memory(cfg, acc)                               # train.preflight: before the target loads
    aux = head_inputs(cfg, target)                       # head.aux_layers, head.draft_vocab_size vs target
    order = sample_order(cfg, train_rows, layout)        # which rows each micro-batch reads (exact resume)
    model, optimizer, scheduler = prepare_training(cfg, acc, model, target)   # AdamW, warmup + cosine
"""

from __future__ import annotations

import logging
import math

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.train.loop.accelerator_setup import build_accelerator, fill_deepspeed_config, no_zero3_init
from draftsmith.train.loop.data_steps import SampleOrder

log = logging.getLogger("draftsmith")
PRECISION_NAMES = {"no": "fp32", "bf16": "bf16 mixed precision", "fp16": "fp16 mixed precision"}


def start_accelerator(cfg, log_with):
    """The run's Accelerator and precision ("no", "bf16" or "fp16", recorded in cfg for config.yaml); the
    seed set; only the main process logs below warnings; co-training checks the strategy."""
    from accelerate.utils import set_seed

    acc, precision = build_accelerator(cfg, log_with)
    log.info(
        "training precision: %s (%s, %d process(es))",
        PRECISION_NAMES[precision],
        acc.distributed_type.value,
        acc.num_processes,
    )
    cfg.train.mixed_precision = precision  # config.yaml records what the run trained in
    if not acc.is_main_process:  # one process tells the story
        logging.getLogger("draftsmith").setLevel(logging.WARNING)
    set_seed(cfg.train.seed)
    if cfg.cotrain.enabled:
        from draftsmith.train.objectives.cotrain import check_strategy

        check_strategy(acc)
    return acc, precision


def check_memory(cfg, acc) -> None:
    """The memory preflight (train.preflight): bytes per rank from the target's config, before anything
    loads (train/preflight/report.py)."""
    if cfg.train.preflight == "off":
        return
    from draftsmith.train.preflight.report import check_before_load

    with no_zero3_init(acc):  # its meta-device models must not go through ZeRO-3's zero.Init
        check_before_load(cfg, acc)


def head_inputs(cfg, target) -> list[int]:
    """The aux layers the head reads (head.aux_layers resolved for this target) and its draft vocabulary
    checked against the target's; errors name the config keys the user wrote."""
    from draftsmith.runtime.heads.aux_layers import resolve_aux_layers

    try:
        aux = resolve_aux_layers(cfg.head.aux_layers, target.num_layers)
    except BadInputError as err:
        raise BadInputError("head.aux_layers", err.got, err.expected) from None
    if not 0 < cfg.head.draft_vocab_size <= target.vocab_size:
        raise BadInputError(
            "head.draft_vocab_size",
            cfg.head.draft_vocab_size,
            f"an integer in [1, {target.vocab_size}] (the target's vocabulary)",
        )
    return aux


def sample_order(cfg, rows, layout) -> SampleOrder:
    """Which training rows each micro-batch of each step reads on this rank: a function of the step only.
    The ranks of a tensor-parallel group read the same rows (their target runs together)."""
    t = cfg.train
    return SampleOrder(
        len(rows),
        t.seed,
        t.batch_size,
        t.grad_accum,
        layout.dp,
        layout.dp_rank,
        lengths=rows.lengths,
        bucket_batches=t.bucket_batches,
    )


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warmup to 1, then cosine from 1 to min_ratio at `total` (a multiplier of the base LR).
    A warmup longer than a tenth of the run is cut to a tenth (a smoke run only shrinks max_steps)."""
    warmup = min(warmup, total // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def prepare_training(cfg, acc, model, target):
    """AdamW over the model's trainable parameters (a co-trained target's at cotrain.target_lr_ratio x the
    head's learning rate), warmup + cosine, the model and optimizer prepared by Accelerate -> (model,
    optimizer, scheduler). The scheduler is stepped by hand once per optimizer step: Accelerate's wrapper
    steps it once per process (its schedules count per-process batches), which would shorten ours by the
    world size; it is registered for checkpointing instead."""
    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.cotrain.enabled:
        from draftsmith.train.objectives.cotrain import param_groups

        params = param_groups(params, target.model, t.lr, cfg.cotrain.target_lr_ratio)
    optimizer = torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(t.warmup_steps, t.max_steps, t.min_lr_ratio)
    )
    fill_deepspeed_config(acc, cfg)
    model, optimizer = acc.prepare(model, optimizer)
    acc.register_for_checkpointing(scheduler)
    return model, optimizer, scheduler
