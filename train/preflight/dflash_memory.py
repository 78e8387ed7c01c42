"""The DFlash kind's memory terms (its objective declares them: train/objectives/dflash_objective.py
DFlashKind.memory_terms; train/preflight/estimate.py sums them): EAGLE-3's batch building, then the block
queries.

    terms = dflash_terms(shapes, knobs, setup)   # [Term]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsmith.train.preflight.eagle3_memory import eagle3_batch_terms
from draftsmith.train.preflight.units import Term, act_bytes, layer_saved

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs, Setup
    from draftsmith.train.preflight.shapes import TargetShapes


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
