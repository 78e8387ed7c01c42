"""The EAGLE-3 kind's memory terms (its objective declares them: train/objectives/heads.py
Eagle3Kind.memory_terms; train/preflight/estimate.py sums them): building a batch
(train/objectives/eagle3_data.py), then the training-time test's K unrolled steps
(train/objectives/eagle3_objective.py, train/objectives/ttt_attention.py). P-EAGLE's objective declares these
too; DFlash's reuse the batch's.

    terms = eagle3_terms(shapes, knobs, setup)   # [Term]: batch building, the unroll, a co-trained target
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftsmith.train.preflight.target_memory import target_forward_bytes, target_terms
from draftsmith.train.preflight.units import (
    Term,
    act_bytes,
    kernel_saved,
    layer_saved,
    linear_inputs,
    norm_saved,
    ttt_kernel,
)

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs, Setup
    from draftsmith.train.preflight.shapes import TargetShapes


def eagle3_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One EAGLE-3 micro-batch: its batch building and its unroll (co-trained: the target in the step)."""
    # train/objectives/eagle3_cotrain.py: the target runs in the step, with gradients
    if k.cotrain is not None:
        batch = [t for t in eagle3_batch_terms(s, k, setup) if t.name != "target forward (no_grad)"]
        return target_terms(s, k, setup) + batch + eagle3_step_terms(s, k, setup)
    return eagle3_batch_terms(s, k, setup) + eagle3_step_terms(s, k, setup)


def eagle3_batch_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """Building an EAGLE-3 batch (train/objectives/eagle3_data.py), in sequence: online, the target per row
    with a KV cache, keeping each row's aux and last states; then the rows padded (offline rows pad on the
    host) and the features cast to fp32 for the head."""
    b, tokens = s.dtype_bytes, k.batch * k.length
    a_h, state = len(k.aux_layers) * s.hidden, (len(k.aux_layers) + 1) * s.hidden
    lists = 0 if (k.mode == "offline" and setup.device != "cpu") else tokens * state * b
    terms = []
    if k.mode == "online":
        kv = s.layers * 2 * s.kv_width * b / setup.tp
        width = f"2 x {s.kv_width}"
        if not s.arch.dense:  # MLA's latent cache, KV heads replicated past num_key_value_heads ranks
            kv, width = s.arch.kv_cache_bytes(b, setup.tp, setup.dense), f"{s.arch.cache_width}"
        ws = target_forward_bytes(s, setup.mode, setup.tp, setup.dense)
        row = k.length * (kv + max(ws + b * a_h, 2 * b * a_h + b * s.hidden))
        how = f"per row: KV cache ({s.layers} layers x {width} x {b} B / token), a layer's work"
        terms.append(
            Term("target forward (no_grad)", (k.batch - 1) * k.length * state * b + row, how, "batch")
        )
    padded = lists + tokens * state * b
    cast = tokens * (state * b + (4 * a_h if b != 4 else 0))
    how = f"aux + last states ({b} B), padded; features to fp32"
    terms.append(Term("batch tensors", max(padded, cast), how, "batch"))
    return terms


def decomposed_saved(s: TargetShapes, mode: str, step: int, explicit: int = 0) -> int:
    """The TTT step's attention without a mask (train/objectives/ttt_attention.py) per token: the causal
    kernel's q, out and log-sum-exp, the step's own k and v (step 0's are every step's prefix keys), and for
    k >= 1 the merge's softmax weights and, from half inputs, its fp32 copies of q, out and each
    diagonal key and value. `explicit` = T off the CPU (causal_attention_math, the default there): each
    query also keeps its [T] scores and softmax per head, and k, v repeated to every query head."""
    a = act_bytes(mode)
    saved = 2 * a * s.q_width + 4 * s.heads + 2 * a * s.kv_width
    saved += (2 * a * s.heads * explicit + 2 * a * s.q_width) if explicit else 0
    if step == 0:
        return saved
    saved += (step + 1) * 4 * s.heads
    if mode != "fp32":
        saved += 8 * s.q_width + step * 8 * s.kv_width
    return saved


def dense_saved(s: TargetShapes, mode: str, device: str, length: int, step: int) -> float:
    """The reference TTT attention (train.ttt_attention=dense): SDPA over the (k+1)T keys of a cache
    grown by concatenation, with a dense boolean [T, (k+1)T] mask."""
    keys = (step + 1) * length
    mask = 4 * keys if device == "cpu" else 0  # CPU keeps the bool mask as an fp32 additive one
    return kernel_saved(ttt_kernel(s, device), s, mode, length, keys, mask)


def eagle3_step_terms(s: TargetShapes, k: Knobs, setup: Setup) -> list[Term]:
    """One EAGLE-3 micro-batch (train/objectives/eagle3_objective.py): its inputs and the target's draft-vocab
    distributions at the positions a loss reads (worst case: all), built `logit_chunk` rows at a time;
    then K unrolled steps of the head, each keeping its layers' activations, its attention's tensors and
    the outputs its chunked soft cross-entropy reads (each chunk's logits are recomputed in backward)."""
    mode, tokens, t, b = setup.mode, k.batch * k.length, k.length, s.dtype_bytes
    a, h, vd = act_bytes(mode), s.hidden, k.draft_vocab
    a_h, layers = len(k.aux_layers) * h, k.options.get("num_layers", 1)
    chunk = min(k.logit_chunk, tokens)
    inputs = tokens * (4 * a_h + b * h + 4 * vd + 30)  # features, last hidden, target probs [N, Vd], ids
    fuse = 0 if mode == "fp32" else 2 * a_h  # fc's half copy of the features
    if k.options.get("fc_norm") or k.options.get("norm_before_fc"):
        fuse += norm_saved(mode, a_h, False)
    internals = (
        norm_saved(mode, h, False)  # input_layernorm(embedding): the embedding needs no gradient
        + norm_saved(mode, h, True)  # hidden_norm(feature)
        + linear_inputs(mode, 2 * h, 3)  # [norm(embedding); norm(feature)] into q/k/v
        + layer_saved(s, mode, count_input=False)
        + (layers - 1) * layer_saved(s, mode, count_input=True)
        + 2 * a * s.head_dim  # rope's cos and sin
    )
    if k.attention == "dense":
        kernels = [tokens * layers * dense_saved(s, mode, setup.device, t, j) for j in range(k.steps)]
        kind = f"dense [T,(k+1)T] mask, {ttt_kernel(s, setup.device)} kernel"
    else:
        explicit = t if k.attention == "decomposed" and setup.device != "cpu" else 0
        kernels = [tokens * layers * decomposed_saved(s, mode, j, explicit) for j in range(k.steps)]
        kind = ("explicit [T,T] scores" if explicit else "a fused causal kernel") + " + k diagonal keys"
    loss = tokens * k.steps * a * h  # the counted outputs each step's chunked cross-entropy reads
    saved, attention = tokens * (fuse + k.steps * internals), sum(kernels)
    recompute = 0.0
    if k.checkpointing:  # each step keeps its inputs, output and cache entries; one step is recomputed
        kept = b * h + 8 + a * h + 2 * a * s.kv_width * layers
        saved, attention = tokens * (fuse + k.steps * kept), 0.0
        recompute = 2 * (tokens * internals + kernels[-1])  # its tensors and their gradients
    math = k.attention == "dense" and ttt_kernel(s, setup.device) == "math"
    largest = 4 * s.heads * k.steps * t if math else 0  # the last step's fp32 scores
    logits = chunk * ((b + (4 if b != 4 else 0)) * s.vocab + 8 * vd)  # [C, V] logits (+ fp32), [C, Vd] probs
    working = max(
        chunk * (12 * h + 16 * vd),  # a cross-entropy chunk recomputed: logits, targets, log-softmax, product
        tokens * 2 * max(largest, a * s.intermediate),  # backward's first gradients
        recompute,
    )
    how = f"before the unroll: the inputs and {chunk}-row chunks of [., V] logits (train.logit_chunk)"
    return [
        Term("target distributions", inputs + logits, how, "batch"),
        Term(
            "inputs: features, target probs", inputs, f"B x T x (A*H fp32 + H + Vd fp32), Vd = {vd}", "step"
        ),
        Term(
            "head activations (B x T x K)",
            saved,
            f"{k.steps} steps x {layers} layer(s): norms, q/k/v/o inputs, MLP [I]",
            "step",
        ),
        Term("attention", attention, f"{kind}, {k.steps} steps", "step"),
        Term("loss inputs", loss, "K x B x T x H: outputs the chunked soft cross-entropy reads", "step"),
        Term("working set", working, "a cross-entropy chunk recomputed, backward's first gradients", "step"),
    ]
