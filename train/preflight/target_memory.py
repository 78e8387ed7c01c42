"""The memory preflight's terms for the target inside a training step, shared by the kinds' own terms
(train/preflight/eagle3_memory.py, mtp_memory.py, medusa_memory.py): its frozen forward's working set under
no_grad, and a co-trained target's activations and next-token loss.

    ws = target_forward_bytes(shapes, "half", tp=1)   # bytes per token of one decoder layer's working set
    terms = target_terms(shapes, knobs, setup)        # [Term]: the target's forward / co-training
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsmith.train.preflight.units import Term, kernel_saved, layer_saved, norm_saved

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs, Setup
    from draftsmith.train.preflight.shapes import TargetShapes


def target_forward_bytes(s: TargetShapes, mode: str, tp: int, dense: bool = True) -> float:
    """One decoder layer's transient working set per token under no_grad (the larger of a norm's fp32
    copies and the MLP's three [I] tensors), split by tensor parallelism (`dense` False: ep with the
    attention and dense MLPs whole, only the experts split)."""
    b = 4 if mode == "fp32" else s.dtype_bytes
    if not s.arch.dense:  # MoE experts, MLA's expanded keys and values (train/preflight/families.py)
        return s.arch.forward_work(mode, b, s.hidden, tp, dense)
    norm = 2 * b * s.hidden + (0 if mode == "fp32" else 8 * s.hidden)
    mlp = 2 * b * s.hidden + 3 * b * s.intermediate / tp
    return max(norm, mlp)


def target_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """The target inside an MTP or Medusa step: online, its forward under no_grad (the frozen target's,
    or a co-trained one's teacher); co-trained, every layer's activations and its next-token loss."""
    mode, tokens, t = setup.mode, k.batch * k.length, k.length
    h, v, b, cotrain = s.hidden, s.vocab, s.dtype_bytes, k.cotrain is not None
    terms = []
    if k.mode == "online" and (not cotrain or k.self_distill):  # the frozen target's or the teacher's
        ws = tokens * (target_forward_bytes(s, mode, setup.tp, setup.dense) + 2 * b * h + t)  # + bool mask
        terms.append(Term("target forward (no_grad)", ws, "a layer's working set, [B,1,T,T] mask", "batch"))
    if cotrain:  # the target runs with gradients: every layer keeps its activations
        per_layer = layer_saved(s, "half" if mode != "fp32" else mode, True, s.qk_norm) + kernel_saved(
            "flash", s, mode, t, t
        )
        target = tokens * (s.layers * per_layer + norm_saved(mode, h, True) + 4 * v)
        how = f"{s.layers} layers with gradients + next-token loss"
        terms.append(Term("target activations (co-training)", target, how, "step"))
    return terms
