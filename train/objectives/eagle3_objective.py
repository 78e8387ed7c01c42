"""EAGLE-3 training-time test (TTT): unroll the head K steps on its own features, as drafting does.

    out = ttt_loss(head, target.embed, batch, steps=7, decay=0.8, target_logits=target.logits)
    out.loss.backward()                       # gradients reach the head only
    out.accuracy                              # [K] top-1 agreement with the target per step

A batch holds, per position t: the token ids, the target's fused aux features F_t [A*Ht], the target's
last pre-norm hidden state at t (its logits there are its distribution over token t+1) and the loss mask
(1 = token t is supervised).

Step 0 feeds the pairs (token t+1, fc(F_t)) and predicts token t+2, exactly what the drafter does for
committed tokens. Step k feeds (token t+k+1, the head's own step-(k-1) output at t) and predicts token
t+k+2: the depth-k node of a chain drafted from root t, with the true token as input (teacher forcing)
and the head's own feature, as at inference. Attention follows the drafter's tree mask: the step-k query
at t sees the step-0 keys at positions <= t (the committed prefix) and the step-1..k keys at t itself
(its ancestors). `TTTCache` computes exactly that without a mask: causal attention over the step-0 keys
plus k diagonal dot products, merged by log-sum-exp (EAGLE-3's decomposition,
train/objectives/ttt_attention.py). The reference `attention="dense"` keeps what the drafter's code does: one
KV cache of (k+1)*T slots and a block mask [T, (k+1)T] (`step_mask`) for SDPA. Position ids are t + k, the
drafter's root position + depth.

Loss per step: soft cross-entropy between the head's draft-vocab distribution and the target's
distribution restricted to the draft vocabulary (renormalized), on positions whose predicted token is
supervised and whose target argmax lies in the draft vocabulary (SpecForge's rule; elsewhere no draft
token could be right), weighted decay**k (EAGLE-3 / SpecForge: 0.8). The target's logits are computed
only at the positions some step reads, `logit_chunk` rows at a time, and the soft cross-entropy runs over
chunks of the counted rows, recomputed in backward (torch.utils.checkpoint): no [B, T, V] or [B, T, Vd]
logits tensor exists. `divergence` swaps the soft cross-entropy for another loss of
train/objectives/draft_losses.py and `weights` the decay for explicit step weights (head.loss,
head.ttt_weights: train/objectives/eagle3_levers.py). Simulated tau = 1 + sum_k prod_{j<=k} acc_j, the
expected accepted length of a chain if step accuracies were independent. `ttt_loss_ref` is the loss as first
written (dense attention, logits everywhere), the oracle tests and scripts/ttt_step_bench.py compare against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Head
from draftsmith.train.objectives.eagle3_levers import divergence_loss, over_chunks
from draftsmith.train.objectives.ttt_attention import ttt_attention

ATTENTIONS = ("decomposed", "dense", "flex")  # flex: decomposed, its causal part on FlexAttention (CUDA)


@dataclass
class TTTBatch:
    input_ids: torch.Tensor  # [B, T]
    features: torch.Tensor  # [B, T, A*Ht] fused target aux hidden states
    target_hidden: torch.Tensor  # [B, T, Ht] the target's last pre-norm hidden state (logits over t+1)
    loss_mask: torch.Tensor  # [B, T] 1 = token t is supervised
    valid: torch.Tensor | None = None  # [B, T] False on padding (right-padded rows)


@dataclass
class TTTOutput:
    loss: torch.Tensor  # scalar: sum_k decay**k * loss_k
    step_losses: torch.Tensor  # [K]
    correct: torch.Tensor  # [K] counted positions where the head's argmax = the target's
    counted: torch.Tensor  # [K] positions counted per step

    @property
    def accuracy(self) -> torch.Tensor:  # [K]
        return self.correct / self.counted.clamp(min=1)

    @property
    def simulated_tau(self) -> float:
        return simulated_tau(self.accuracy)


def simulated_tau(accuracy) -> float:
    """1 + sum_k prod_{j<=k} acc_j: a chain's expected accepted length if step accuracies were independent."""
    return 1.0 + float(torch.cumprod(torch.as_tensor(accuracy, dtype=torch.float64), dim=0).sum())


# ---- attention ----------------------------------------------------------------------------------------
def step_mask(length: int, step: int, device) -> torch.Tensor:
    """[T, (step+1)T] bool: step-0 keys causal, step-j keys (1 <= j <= step) only at the query's position."""
    blocks = [torch.ones(length, length, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(length, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, dim=1)


class GrowingCache:
    """The reference: the KVCache interface the head uses, built by concatenation instead of in-place
    writes, so autograd can differentiate through every step's keys and values (training only)."""

    def __init__(self, batch: int, device):
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [B, nkv, S, d]
        self.values: dict[int, torch.Tensor] = {}
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self.length = 0

    def reserve(self, new_tokens: int, token_valid: torch.Tensor) -> None:
        self.valid = torch.cat([self.valid, token_valid], dim=1)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        old_k, old_v = self.keys.get(layer_idx), self.values.get(layer_idx)
        self.keys[layer_idx] = keys if old_k is None else torch.cat([old_k, keys], dim=2)
        self.values[layer_idx] = values if old_v is None else torch.cat([old_v, values], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def commit(self) -> None:
        self.length = self.valid.shape[1]


class TTTCache:
    """Each TTT step's keys and values per layer, kept apart (no concatenation, no mask). The head's
    attention calls `at(step).attend(q, k, v, layer)`: it stores the step's keys and values and attends
    over the step-0 keys causally and the step-1..k keys on the diagonal
    (train/objectives/ttt_attention.py)."""

    def __init__(self, backend: str | None = None):
        self.kv: dict[
            tuple[int, int], tuple[torch.Tensor, torch.Tensor]
        ] = {}  # (layer, step) -> [B, nkv, T, d]
        self.backend = backend  # None = by device

    def at(self, step: int) -> TTTStepCache:
        return TTTStepCache(self, step)


class TTTStepCache:
    """The cache as step `step` sees it. Bound to its step, so a recomputation in backward (activation
    checkpointing) reads the same keys and stores the same values again."""

    def __init__(self, cache: TTTCache, step: int):
        self.cache, self.step = cache, step

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
        kv = self.cache.kv
        kv[layer_idx, self.step] = (k, v)
        diagonal = [kv[layer_idx, j] for j in range(1, self.step + 1)]
        (k0, v0) = kv[layer_idx, 0]
        return ttt_attention(
            q, k0, v0, [d[0] for d in diagonal], [d[1] for d in diagonal], self.cache.backend
        )  # [B, nh, T, d]


def unroll(
    head: Eagle3Head,
    embed,
    input_ids: torch.Tensor,  # [B, T]
    features: torch.Tensor,  # [B, T, A*Ht]
    steps: int,
    attention: str = "decomposed",  # or "dense": the reference (SDPA over (k+1)T keys, step_mask)
    checkpoint_layers: bool = False,  # recompute each step's head layers in backward
):
    """Yield the head's output [B, T, H] at steps 0..steps-1 (step k at t predicts token t+k+2)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: one of {ATTENTIONS}")
    if checkpoint_layers and attention == "dense":
        raise ValueError("activation checkpointing needs attention='decomposed' (the dense cache grows)")
    length, device = input_ids.shape[1], input_ids.device
    if attention == "flex" and device.type != "cuda":
        raise BadInputError(
            "train.ttt_attention", "flex", "a CUDA device", "FlexAttention has no backward on a CPU"
        )
    if attention == "dense":
        cache = GrowingCache(input_ids.shape[0], device)
    else:
        cache = TTTCache("flex" if attention == "flex" else None)
    feature = head.fuse(features)  # [B, T, H]
    positions = torch.arange(length, device=device)[None].expand_as(input_ids)
    for k in range(steps):
        tokens = torch.zeros_like(input_ids)  # pair t at step k reads token t+k+1 (zeros past the end)
        tokens[:, : max(length - k - 1, 0)] = input_ids[:, k + 1 :]
        with torch.no_grad():  # the target's embedding is reused and frozen
            embeds = embed(tokens)
        if attention == "dense":
            h = head(embeds, feature, positions + k, cache, tree_mask=step_mask(length, k, device))
        elif checkpoint_layers and torch.is_grad_enabled():
            h = checkpoint(head, embeds, feature, positions + k, cache.at(k), use_reentrant=False)
        else:
            h = head(embeds, feature, positions + k, cache.at(k))
        yield h
        feature = head.next_feature(h)  # the next step reads the head's own output (normed with norm_output)


# ---- loss ---------------------------------------------------------------------------------------------
def draft_targets(head: Eagle3Head, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target distribution over the draft vocab [.., Vd] and whether its argmax is a draft token [..]."""
    ids = head.d2t + torch.arange(len(head.d2t), device=head.d2t.device)  # draft id -> target id
    logits = target_logits.to(torch.promote_types(target_logits.dtype, torch.float32))
    return torch.softmax(logits[..., ids], dim=-1), head.t2d[target_logits.argmax(dim=-1)]


@torch.no_grad()
def target_distributions(
    head: Eagle3Head, target_logits: Callable, hidden: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, Ht] (the target's last pre-norm states where a loss reads them) -> draft_targets over
    the N rows [N, Vd], [N], computing `chunk` rows of the target's [chunk, V] logits at a time."""
    probs, in_vocab = None, torch.zeros(len(hidden), dtype=torch.bool, device=hidden.device)
    for start in range(0, max(len(hidden), 1), chunk):
        p, v = draft_targets(head, target_logits(hidden[start : start + chunk]))
        probs = p.new_empty(len(hidden), p.shape[-1]) if probs is None else probs
        probs[start : start + len(p)], in_vocab[start : start + len(v)] = p, v
    return probs, in_vocab


def target_reads(head, batch: TTTBatch, target_logits: Callable, logit_chunk: int):
    """The target's draft distributions where some step (or depth) reads them, p with p+1 supervised ->
    (supervised [B, T], probs [R, Vd], row_of [B, T]: position p's row in probs where read, in_vocab_at
    [B, T]: the token after p+1 is in the draft vocabulary)."""
    valid = torch.ones_like(batch.input_ids, dtype=torch.bool) if batch.valid is None else batch.valid
    supervised = (batch.loss_mask > 0) & valid  # [B, T]
    read = torch.zeros_like(supervised)  # [B, T]: p where some step reads the target (p+1 supervised)
    read[:, 1:-1] = supervised[:, 2:]
    probs, in_vocab = target_distributions(head, target_logits, batch.target_hidden[read], logit_chunk)
    row_of = read.flatten().cumsum(0).view_as(read) - 1  # [B, T] row of position p in probs, where read
    in_vocab_at = torch.zeros_like(read)
    in_vocab_at[read] = in_vocab
    return supervised, probs, row_of, in_vocab_at


def _soft_ce_chunk(head: Eagle3Head, probs: torch.Tensor, h: torch.Tensor, rows: torch.Tensor):
    """h [C, H] outputs, rows [C] their targets' rows of probs -> (sum of soft CE, argmax matches)."""
    logits = head.draft_logits(h)  # [C, Vd]
    target = probs[rows]  # [C, Vd]
    ce = -(target * F.log_softmax(logits, dim=-1)).sum()
    return ce, (logits.argmax(-1) == target.argmax(-1)).sum()


def soft_ce(head: Eagle3Head, h: torch.Tensor, rows: torch.Tensor, probs: torch.Tensor, chunk: int):
    """Soft cross-entropy summed over the counted outputs h [n, H] against probs[rows], `chunk` rows at
    a time; with gradients each chunk's logits are recomputed in backward instead of kept."""
    ces, corrects = over_chunks(_soft_ce_chunk, (head, probs), h, rows, chunk)
    return torch.stack(ces).sum(), torch.stack(corrects).sum()


def ttt_loss(
    head: Eagle3Head,
    embed,
    batch: TTTBatch,
    steps: int = 7,
    decay: float = 0.8,
    *,
    target_logits: Callable,  # the target's pre-norm hidden [N, Ht] -> logits [N, V] (Target.logits)
    logit_chunk: int = 1024,  # rows per chunk of target logits and of the soft cross-entropy
    attention: str = "decomposed",
    checkpoint_layers: bool = False,
    # head.loss (train/objectives/draft_losses.py); kl: the soft cross-entropy, as always
    divergence: str = "kl",
    weights=None,  # head.ttt_weights: per-step loss weights (the first `steps`); None = decay**k
) -> TTTOutput:
    ids, length = batch.input_ids, batch.input_ids.shape[1]
    supervised, probs, row_of, in_vocab_at = target_reads(head, batch, target_logits, logit_chunk)
    losses, corrects, counts = [], [], []
    for k, h in enumerate(unroll(head, embed, ids, batch.features, steps, attention, checkpoint_layers)):
        # step k at t is scored against the target's distribution at t+k+1 (over token t+k+2)
        width = max(length - k - 1, 0)
        counted = torch.zeros_like(supervised)
        counted[:, : max(length - k - 2, 0)] = supervised[:, k + 2 :]
        counted[:, :width] &= in_vocab_at[:, k + 1 :]
        rows, n = row_of[:, k + 1 :][counted[:, :width]], counted.sum()
        if divergence == "kl":  # KL + the target's entropy: the same gradients, the loss logged as before
            ce, correct = soft_ce(head, h[counted], rows, probs, logit_chunk)
            losses.append(ce / n.clamp(min=1))
        else:  # train/objectives/eagle3_levers.py: the same chunking, another per-position loss
            loss_k, correct = divergence_loss(divergence, head, h[counted], rows, probs, logit_chunk)
            losses.append(loss_k)
        corrects.append(correct)
        counts.append(n)
    step_losses = torch.stack(losses)
    if weights is None:
        weights = decay ** torch.arange(steps, device=ids.device, dtype=step_losses.dtype)
    else:
        weights = torch.as_tensor(weights[:steps], device=ids.device, dtype=step_losses.dtype)
    return TTTOutput((weights * step_losses).sum(), step_losses, torch.stack(corrects), torch.stack(counts))


def ttt_loss_ref(
    head: Eagle3Head, embed, batch: TTTBatch, steps: int = 7, decay: float = 0.8, *, target_logits: Callable
) -> TTTOutput:
    """The loss as first written, the oracle: dense-mask attention over (k+1)T keys, the target's logits
    [B, T, V] at every position, one soft cross-entropy over [B, T, Vd] per step."""
    outputs = unroll(head, embed, batch.input_ids, batch.features, steps, "dense")
    return dense_step_losses(head, outputs, batch, decay, target_logits)


def dense_step_losses(head, outputs, batch: TTTBatch, decay: float, target_logits: Callable) -> TTTOutput:
    """The reference losses of step outputs (step k's [B, T, H] predicts token t+k+2 from position t),
    dense: the target's logits at every position, a soft cross-entropy over [B, T, Vd] per step, weighted
    decay**k (ttt_loss_ref; P-EAGLE's one-pass reference feeds it its block positions)."""
    ids, length = batch.input_ids, batch.input_ids.shape[1]
    valid = torch.ones_like(ids, dtype=torch.bool) if batch.valid is None else batch.valid
    losses, corrects, counts = [], [], []
    with torch.no_grad():
        all_probs, all_in_vocab = draft_targets(head, target_logits(batch.target_hidden))  # [B, T, Vd]
    for k, h in enumerate(outputs):
        logits = head.draft_logits(h)  # [B, T, Vd]
        probs, in_vocab = torch.zeros_like(all_probs), torch.zeros_like(all_in_vocab)
        probs[:, : max(length - k - 1, 0)] = all_probs[:, k + 1 :]
        in_vocab[:, : max(length - k - 1, 0)] = all_in_vocab[:, k + 1 :]
        counted = torch.zeros_like(valid)
        counted[:, : max(length - k - 2, 0)] = (batch.loss_mask[:, k + 2 :] > 0) & valid[:, k + 2 :]
        counted &= in_vocab
        ce = -(probs * F.log_softmax(logits, dim=-1)).sum(-1)  # [B, T]
        n = counted.sum()
        losses.append((ce * counted).sum() / n.clamp(min=1))
        corrects.append(((logits.argmax(-1) == probs.argmax(-1)) & counted).sum())
        counts.append(n)
    step_losses = torch.stack(losses)
    weights = decay ** torch.arange(len(losses), device=ids.device, dtype=step_losses.dtype)
    return TTTOutput((weights * step_losses).sum(), step_losses, torch.stack(corrects), torch.stack(counts))
