"""EAGLE-3 training-time test (TTT): unroll the head K steps on its own features, as drafting does.

    out = ttt_loss(head, target.embed, batch, steps=7, decay=0.8)
    out.loss.backward()                       # gradients reach the head only
    out.accuracy                              # [K] top-1 agreement with the target per step

A batch holds, per position t: the token ids, the target's fused aux features F_t [A*Ht], the target's
logits at t (its distribution over token t+1) and the loss mask (1 = token t is supervised).

Step 0 feeds the pairs (token t+1, fc(F_t)) and predicts token t+2, exactly what the drafter does for
committed tokens. Step k feeds (token t+k+1, the head's own step-(k-1) output at t) and predicts token
t+k+2: the depth-k node of a chain drafted from root t, with the true token as input (teacher forcing)
and the head's own feature, as at inference. Attention follows the drafter's tree mask: the step-k query
at t sees the step-0 keys at positions <= t (the committed prefix) and the step-1..k keys at t itself
(its ancestors), so one KV cache of (k+1)*T slots and a block mask [T, (k+1)T] cover a step; SDPA runs it
(no eager O(T^2) attention). Position ids are t + k, the drafter's root position + depth.

Loss per step: soft cross-entropy between the head's draft-vocab distribution and the target's
distribution restricted to the draft vocabulary (renormalized), on positions whose predicted token is
supervised and whose target argmax lies in the draft vocabulary (SpecForge's rule; elsewhere no draft
token could be right), weighted decay**k (EAGLE-3 / SpecForge: 0.8). Simulated tau = 1 + sum_k prod_{j<=k}
acc_j, the expected accepted length of a chain if step accuracies were independent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from draftsmith.runtime.eagle3 import Eagle3Head


@dataclass
class TTTBatch:
    input_ids: torch.Tensor  # [B, T]
    features: torch.Tensor  # [B, T, A*Ht] fused target aux hidden states
    target_logits: torch.Tensor  # [B, T, V] the target's logits at each position (over token t+1)
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


def step_mask(length: int, step: int, device) -> torch.Tensor:
    """[T, (step+1)T] bool: step-0 keys causal, step-j keys (1 <= j <= step) only at the query's position."""
    blocks = [torch.ones(length, length, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(length, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, dim=1)


def draft_targets(head: Eagle3Head, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target distribution over the draft vocab [.., Vd] and whether its argmax is a draft token [..]."""
    ids = head.d2t + torch.arange(len(head.d2t), device=head.d2t.device)  # draft id -> target id
    probs = torch.softmax(target_logits.float()[..., ids], dim=-1)
    in_vocab = head.t2d[target_logits.argmax(dim=-1)]
    return probs, in_vocab


class GrowingCache:
    """The KVCache interface the head uses, built by concatenation instead of in-place writes, so
    autograd can differentiate through every step's keys and values (training only)."""

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


def unroll(head: Eagle3Head, embed, input_ids: torch.Tensor, features: torch.Tensor, steps: int):
    """Yield the head's output [B, T, H] at steps 0..steps-1 (step k at t predicts token t+k+2)."""
    length, device = input_ids.shape[1], input_ids.device
    cache = GrowingCache(input_ids.shape[0], device)
    feature = head.fuse(features)  # [B, T, H]
    positions = torch.arange(length, device=device)[None].expand_as(input_ids)
    for k in range(steps):
        tokens = torch.zeros_like(input_ids)  # pair t at step k reads token t+k+1 (zeros past the end)
        tokens[:, : max(length - k - 1, 0)] = input_ids[:, k + 1 :]
        with torch.no_grad():  # the target's embedding is reused and frozen
            embeds = embed(tokens)
        h = head(embeds, feature, positions + k, cache, tree_mask=step_mask(length, k, device))
        yield h
        feature = head.next_feature(h)  # the next step reads the head's own output (normed with norm_output)


def ttt_loss(head: Eagle3Head, embed, batch: TTTBatch, steps: int = 7, decay: float = 0.8) -> TTTOutput:
    ids, length = batch.input_ids, batch.input_ids.shape[1]
    valid = torch.ones_like(ids, dtype=torch.bool) if batch.valid is None else batch.valid
    losses, corrects, counts = [], [], []
    # the target's draft-vocab distribution [B, T, Vd] and argmax-in-vocab [B, T]: once, shifted per step
    all_probs, all_in_vocab = draft_targets(head, batch.target_logits)
    for k, h in enumerate(unroll(head, embed, ids, batch.features, steps)):
        logits = head.draft_logits(h)  # [B, T, Vd]
        # the target's distribution at t+k+1 (over token t+k+2); rows past the end are never counted
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
    weights = decay ** torch.arange(steps, device=ids.device, dtype=step_losses.dtype)
    return TTTOutput((weights * step_losses).sum(), step_losses, torch.stack(corrects), torch.stack(counts))
