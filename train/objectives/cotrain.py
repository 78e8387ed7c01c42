"""Co-training the target with its head (MTP modules, Medusa-2 heads: train/objectives/medusa2.py): full
fine-tuning or LoRA adapters (peft), and the drift report that keeps a faster but worse target from shipping.

    peft_model = make_trainable(target, cfg.cotrain)   # LoRA adapters injected in place, or all weights
    sums = drift_sums(target, peft_model, batches)     # held-out CE; KL and argmax agreement to the original
    save_cotrained_target(target, peft_model, folder)  # adapters merged, an HF folder + tokenizer
    optimizer = AdamW(param_groups(params, target.model, lr, ratio))   # the target at lr * ratio
    kl = kl_to_original(original_logits(target, peft_model, batch, sel), logits)   # [N] (Medusa-2)

Only ModelOpt co-trains a target with its draft (`eagle_freeze_base_model=False`), and none with LoRA
(among public trainers); DeepSeek-V3 trained its MTP module jointly during pretraining.
LoRA adapters are injected into the target's own modules, so `Target.forward`, `Target.embed` and the
MTP modules see the adapted weights without any other change.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch
from torch.nn import functional as F

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")


def check_strategy(accelerator) -> None:
    """Co-training writes the target from this process's copy at the end: every weight must be whole
    here, which DDP and ZeRO-1/2 guarantee and ZeRO-3 / FSDP (sharded parameters) do not."""
    from accelerate.utils import DistributedType

    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    sharded = (plugin is not None and plugin.zero_stage == 3) or (
        accelerator.distributed_type == DistributedType.FSDP
    )
    if sharded:
        raise BadInputError(
            "cotrain.enabled",
            "true under ZeRO-3/FSDP",
            "one process, DDP or DeepSpeed ZeRO-1/2 (sharded co-training is not supported yet)",
        )


def check_trainable(target) -> None:
    """A quantized target (bitsandbytes, GPTQ, ...) cannot be fine-tuned in full here."""
    quantized = getattr(target.model.config, "quantization_config", None) is not None
    frozen_dtypes = {p.dtype for p in target.model.parameters() if not p.is_floating_point()}
    if quantized or frozen_dtypes:
        raise BadInputError(
            "cotrain.method",
            "full",
            "float weights (this target is quantized): use cotrain.method=lora or the float checkpoint",
        )


def make_trainable(target, cotrain):
    """Unfreeze the target as `cotrain` says; returns the peft model for LoRA (None for full)."""
    model = target.model
    model.requires_grad_(False)
    peft_model = None
    if cotrain.method == "full":
        check_trainable(target)
        model.requires_grad_(True)
    else:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise BadInputError(
                "cotrain.method", "lora", "peft installed (pip install 'draftsmith[train]')"
            ) from None
        modules = [m.strip() for m in cotrain.lora_target_modules.split(",") if m.strip()]
        config = LoraConfig(
            r=cotrain.lora_rank,
            lora_alpha=cotrain.lora_alpha,
            lora_dropout=cotrain.lora_dropout,
            target_modules=modules,
            bias="none",
        )
        try:
            peft_model = get_peft_model(model, config)  # injects adapters into `model` in place
        except ValueError as err:
            raise BadInputError(
                "cotrain.lora_target_modules", modules, "module names of the target", str(err)
            ) from None
    if cotrain.freeze_embeddings:  # the embedding and the LM head (tied in many small models)
        model.get_input_embeddings().requires_grad_(False)
        model.get_output_embeddings().requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info(
        "co-training the target (%s): %.2fM of %.1fM parameters train",
        cotrain.method,
        trainable / 1e6,
        total / 1e6,
    )
    return peft_model


def target_hidden(target, input_ids: torch.Tensor, valid: torch.Tensor, with_pre_norm: bool = False):
    """The target's last hidden state after its final norm [B, T, H] via the model's own forward on a
    right-padded batch; with `with_pre_norm`, also the residual stream entering that norm (a hook)."""
    captured = []
    hook = (
        target.decoder.norm.register_forward_hook(lambda _m, args, _out: captured.append(args[0]))
        if with_pre_norm
        else None
    )
    try:
        out = target.decoder(input_ids=input_ids, attention_mask=valid.long(), use_cache=False)
    finally:
        if hook is not None:
            hook.remove()
    return (out.last_hidden_state, captured[-1]) if with_pre_norm else out.last_hidden_state


def _logits_at(target, batch, sel) -> torch.Tensor:
    logits = target.lm_head(target_hidden(target, batch["input_ids"], batch["valid"])[sel])  # [N, V]
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


@torch.no_grad()
def original_logits(target, original, batch, sel) -> torch.Tensor:
    """The original target's logits [N, V] (float32, on the batch's device) at the positions `sel`:
    `original` is a peft model (the target with its LoRA adapters switched off: no second copy) or another
    Target (the original loaded or copied beside it, `frozen_original`)."""
    if hasattr(original, "disable_adapter"):
        with original.disable_adapter():
            return _logits_at(target, batch, sel)
    moved = {k: v.to(original.device) for k, v in batch.items()}
    return _logits_at(original, moved, sel.to(original.device)).to(batch["input_ids"].device)


def kl_to_original(before: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_original || p_target) per row [N] from the original's logits `before` [N, V] and the target's
    `logits` [N, V], in float32 at least; the gradient flows through `logits` only."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logp, logq = before.detach().to(dtype).log_softmax(-1), logits.to(dtype).log_softmax(-1)
    # kl_div keeps only p for its backward (a manual p * (log p - log q) keeps more [N, V] tensors)
    return F.kl_div(logq, logp, reduction="none", log_target=True).sum(-1)


def frozen_original(target):
    """A frozen copy of `target` as it is now (its weights once more in memory): the original wherever
    the target with its adapters off is not it (full fine-tuning, trained embeddings)."""
    import copy

    from draftsmith.runtime.core.target import Target

    original = Target(copy.deepcopy(target.model).requires_grad_(False).eval(), target.tokenizer, target.name)
    original.path = target.path
    return original


def param_groups(params: list, target_model, lr: float, ratio: float) -> list:
    """The optimizer's parameters: the head's at `lr` (first, so the logged `lr` stays the head's) and the
    target's at `lr * ratio` (Medusa-2's differential learning rates, Cai et al. 2024 section 2.3.2).
    With ratio 1, one plain list: what checkpoints written before the groups existed hold."""
    if ratio == 1.0:
        return params
    ours = {id(p) for p in target_model.parameters()}
    head = [p for p in params if id(p) not in ours]
    tuned = [p for p in params if id(p) in ours]
    return [{"params": head, "lr": lr}, {"params": tuned, "lr": lr * ratio}]


@torch.no_grad()
def drift_sums(target, original, batches) -> torch.Tensor:
    """Sums over the supervised positions of held-out batches: [CE of the target, positions, KL(original
    || target), positions where both argmaxes agree]. `original` is a peft model (the target with its
    LoRA adapters switched off), another Target (the original loaded beside it), or None (full
    co-training keeps no original: the last two stay 0)."""
    from draftsmith.train.objectives.mtp_objective import next_token_loss, teacher_positions

    sums = torch.zeros(4, dtype=torch.float64)
    for batch in batches:
        sel = teacher_positions(batch["loss_mask"], batch["valid"])
        logits = _logits_at(target, batch, sel)
        n = int(sel.sum())
        sums[0] += float(next_token_loss(logits, batch["input_ids"], sel)) * n
        sums[1] += n
        if original is None:
            continue
        before = original_logits(target, original, batch, sel).to(logits.device)
        sums[2] += float(kl_to_original(before, logits).sum())
        sums[3] += float((before.argmax(-1) == logits.argmax(-1)).sum())
    return sums


def save_cotrained_target(target, peft_model, folder) -> object:
    """Merge LoRA adapters (if any) and write an HF folder with the tokenizer, atomically (a temporary
    folder renamed into place); returns the merged model."""
    folder = Path(folder)
    model = peft_model.merge_and_unload() if peft_model is not None else target.model
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    target.tokenizer.save_pretrained(str(tmp))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return model
