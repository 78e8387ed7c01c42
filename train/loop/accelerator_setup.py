"""The Accelerator a run trains with: process group (backend, timeout), precision, DeepSpeed's "auto" values.

    accelerator, precision = build_accelerator(cfg, log_with)   # precision: "no" (fp32), "bf16" or "fp16"

One code path for one CPU, DDP (gloo or NCCL), FSDP2 and DeepSpeed ZeRO-2/3; train/loop/trainer.py calls it.
The precision is explicit for every strategy (train.mixed_precision; auto = bf16 on GPUs, fp32 on CPUs).
"""

from __future__ import annotations

import contextlib
import os

import torch

from draftsmith.runtime.errors import BadInputError


def build_accelerator(cfg, log_with):
    from accelerate import Accelerator

    from draftsmith.train.loop.process_group import process_group_kwargs

    handlers, kwargs = [], {}
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or deepspeed
    if distributed and not torch.cuda.is_available():
        # Without a GPU, Accelerate's PartialState picks no backend and falls back to one process;
        # DDP also needs cpu=True, or each process trains alone.
        handlers.append(process_group_kwargs(cfg, backend="gloo"))
        kwargs["cpu"] = not deepspeed
    elif distributed:  # the timeout on GPUs too (NCCL's default, 10 minutes, an offline capture outlasts)
        handlers.append(process_group_kwargs(cfg))
    if not distributed:  # Accelerate's state is a process-wide singleton: a second run in one process
        from accelerate.state import AcceleratorState  # (the demo, tests) may use other settings

        AcceleratorState._reset_state(reset_partial_state=True)
    # Every strategy gets the precision explicitly. Under DeepSpeed, Accelerate fills the JSON's
    # bf16/fp16 "auto" from it; given none, it reads ACCELERATE_MIXED_PRECISION, whose default "no"
    # silently trained ZeRO-2/3 runs on GPUs in fp32.
    precision = requested_precision(cfg, torch.cuda.is_available())
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.train.grad_accum,
        log_with=log_with,
        project_dir=cfg.output_dir,
        kwargs_handlers=handlers,
        mixed_precision=precision,
        **kwargs,
    )
    return accelerator, effective_precision(accelerator, cfg, precision)


def requested_precision(cfg, cuda: bool) -> str:
    """What `train.mixed_precision` asks for: "auto" is bf16 on a GPU, fp32 ("no") on a CPU."""
    precision = cfg.train.mixed_precision
    if precision == "auto":
        precision = "bf16" if cuda else "no"
    return precision


def deepspeed_precision(ds_config: dict) -> str:
    """The precision a (filled) DeepSpeed config trains in: bf16, fp16 or "no" (fp32)."""
    for name in ("bf16", "fp16"):
        if str(ds_config.get(name, {}).get("enabled", False)).lower() == "true":
            return name
    return "no"


def effective_precision(accelerator, cfg, requested: str) -> str:
    """The precision the run trains in; a DeepSpeed JSON overriding an explicit config is refused."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return requested
    actual = deepspeed_precision(plugin.deepspeed_config)
    if actual != requested and cfg.train.mixed_precision != "auto":
        raise BadInputError(
            "train.mixed_precision",
            cfg.train.mixed_precision,
            f"{actual!r}, what the DeepSpeed config enables (or set its bf16/fp16 'enabled' to \"auto\")",
        )
    return actual


def fill_deepspeed_config(accelerator, cfg) -> None:
    """DeepSpeed's "auto" values that Accelerate can only fill from a dataloader we do not hand it."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    fills = {
        "train_micro_batch_size_per_gpu": cfg.train.batch_size,
        "gradient_accumulation_steps": cfg.train.grad_accum,
        "gradient_clipping": cfg.train.max_grad_norm,
        "train_batch_size": cfg.train.batch_size * cfg.train.grad_accum * accelerator.num_processes,
    }
    for key, value in fills.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value


@contextlib.contextmanager
def no_zero3_init(accelerator):
    """Under ZeRO-3, transformers loads models partitioned (zero.Init) while Accelerate's DeepSpeed config
    is registered with it; the frozen target must stay whole on every rank, so unregister it meanwhile."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()
