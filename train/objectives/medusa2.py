"""Medusa-2 (Cai et al. 2024, arXiv:2401.10774 section 2.3.2): the target trains with its Medusa heads.

    side, peft_model, original = cotrained_target(cfg, target)   # LoRA (peft) or full; the teacher
    model = MedusaModel(heads, target, labels, decay, cotrain=side)  # train/objectives/medusa_objective.py
    side.weight = medusa_weight(step, cfg.head)                      # lambda0 of this optimizer step
    heads = bind_to_target(heads, merged_model, "runs/x/final/target")  # only that target serves them

The loss is L = L_LM + lambda0 * L_medusa, L_medusa Medusa-1's sum_k 0.8^k CE_k
(train/objectives/medusa_objective.py), here with the gradient flowing through the heads into the target. The
paper's three ingredients, as config keys of the Medusa `head:` section (runtime/heads/medusa_kind.py) and
`cotrain:` (train/config.py):
- combined loss: `head.cotrain_weight` (lambda0; 0.2 in the Medusa-2 axolotl recipes);
- heads warmup: lambda0 ramps up over `head.cotrain_weight_warmup_steps` (`head.cotrain_weight_schedule`:
  linear or sine), so the heads' large early loss does not drag the target before they have learned anything;
- differential learning rates: the target's weights train at `train.lr * target_lr_ratio`, the heads at
  `train.lr` (the trainer's parameter groups, train/objectives/cotrain.param_groups).
L_LM is the target's cross-entropy on the data, or with `self_distill` (the data's answers are not the
target's own) KL(p_original || p_target) per position, the paper's self-distillation loss: the teacher is
the target with its LoRA adapters switched off (peft's `disable_adapter`, no second copy), or, when that is
not the original (full fine-tuning, or trained embeddings), a frozen copy of the original target
(train/objectives/cotrain.frozen_original: its weights once more in memory, which the preflight counts).
Tests: tests/train/test_medusa2.py.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

from torch import nn

from draftsmith.train.objectives.cotrain import (
    frozen_original,
    kl_to_original,
    make_trainable,
    original_logits,
    target_hidden,
)
from draftsmith.train.objectives.mtp_objective import next_token_loss, teacher_positions

log = logging.getLogger("draftsmith")


def medusa_weight(step: int, head) -> float:
    """lambda0 at optimizer step `step` (0-based) of a Medusa `head:` section (runtime/heads/medusa_kind.py):
    `cotrain_weight` times the warmup's ramp, which reaches 1 at step `cotrain_weight_warmup_steps - 1`
    (linear: (s+1)/W; sine: sin(pi/2 (s+1)/W)), 1 after it."""
    warmup = head.cotrain_weight_warmup_steps
    if warmup <= 0:
        return head.cotrain_weight
    ramp = min(1.0, (step + 1) / warmup)
    if head.cotrain_weight_schedule == "sine":
        ramp = math.sin(0.5 * math.pi * ramp)
    return head.cotrain_weight * ramp


class CotrainedTarget(nn.Module):
    """The target side of Medusa-2: its forward with gradients and its own loss. The target's model is a
    submodule (trained, so DDP and DeepSpeed must see it); the teacher is hidden in a list (never trained
    or saved)."""

    def __init__(self, target, teacher=None, self_distill: bool = False, weight: float = 1.0):
        super().__init__()
        self.target_model = target.model
        self._target, self._teacher = [target], [teacher]
        self.self_distill, self.weight = self_distill, weight

    def forward(self, input_ids, loss_mask, valid):
        """-> (h [B, T, H] after the final norm, logits [N, V] at `teacher_positions`, L_LM)."""
        target = self._target[0]
        h = target_hidden(target, input_ids, valid)  # with gradients: the heads' loss reaches the target
        sel = teacher_positions(loss_mask, valid)  # [B, T]: positions whose next token is supervised
        logits = target.lm_head(h[sel])  # [N, V]
        if self.self_distill:
            batch = {"input_ids": input_ids, "valid": valid}
            before = original_logits(target, self._teacher[0], batch, sel)  # [N, V], no grad
            lm = kl_to_original(before, logits).sum() / max(int(sel.sum()), 1)
        else:
            lm = next_token_loss(logits, input_ids, sel)
        return h, logits, lm


def cotrained_target(cfg, target):
    """Make `target` trainable as `cfg.cotrain` says; -> (CotrainedTarget, peft model or None, the
    original for the drift report or None). The frozen copy is taken before any adapter is injected."""
    c = cfg.cotrain
    copy_needed = c.method == "full" or not c.freeze_embeddings  # adapters off would not be the original
    original = frozen_original(target) if c.self_distill and copy_needed else None
    peft_model = make_trainable(target, c)
    teacher = original if original is not None else peft_model
    if c.self_distill:
        how = "a frozen copy of the original" if original is not None else "the target with adapters off"
        log.info("Medusa-2 self-distillation: the target's loss is KL to %s", how)
    side = CotrainedTarget(target, teacher, c.self_distill, medusa_weight(0, cfg.head))
    return side, peft_model, teacher


def bind_to_target(heads, merged_model, folder) -> nn.Module:
    """The same heads with their config naming the co-trained target in `folder` and its weights hash
    (runtime/core/artifacts.weights_hash), so loading them against any other target exits 2."""
    from draftsmith.runtime.core.artifacts import weights_hash

    config = replace(
        heads.config, target=str(Path(folder)), target_weights_hash=weights_hash(merged_model), cotrained=True
    )
    out = type(heads)(config)
    out.load_state_dict(heads.state_dict())
    return out.to(heads.d2t.device)
