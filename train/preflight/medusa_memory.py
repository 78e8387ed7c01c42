"""The Medusa kind's memory terms (its objective declares them: train/objectives/medusa_objective.py
MedusaKind.memory_terms; train/preflight/estimate.py sums them): the target's last state and logits, then K
heads on that one state, with no attention.

    terms = medusa_terms(shapes, knobs, setup)   # [Term]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsmith.train.preflight.target_memory import target_terms
from draftsmith.train.preflight.units import Term, act_bytes, linear_inputs

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs, Setup
    from draftsmith.train.preflight.shapes import TargetShapes


def medusa_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One Medusa micro-batch (train/objectives/medusa_objective.py): the target's last state h and its logits
    at every supervised position (worst case: all), then K heads on that one state, each its residual
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
