"""The MTP kind's memory terms (its objective declares them: train/objectives/heads.py MtpKind.memory_terms;
train/preflight/estimate.py sums them): the target's logits and last states, then each module's block.

    terms = mtp_terms(shapes, knobs, setup)   # [Term]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsmith.train.preflight.target_memory import target_terms
from draftsmith.train.preflight.units import (
    Term,
    act_bytes,
    kernel_saved,
    layer_saved,
    linear_inputs,
    norm_saved,
)

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs, Setup
    from draftsmith.train.preflight.shapes import TargetShapes


def mtp_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One MTP micro-batch (train/objectives/heads.py MtpModel, train/objectives/mtp_objective.py): the
    target's last hidden states and its logits at every supervised position (worst case: all), then per module
    the block's activations and the soft cross-entropy over the full vocabulary."""
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
