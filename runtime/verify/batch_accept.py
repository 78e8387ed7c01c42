"""The acceptance step for a whole batch in one call to draftsmith.kernels (Triton on CUDA, the torch
references elsewhere), with one host synchronization per cycle.

    decided = accept_batch(batch, logits, params, generators)    # batch: a DraftBatch; logits [B, N, V]
    verdicts, depths, fetched = fetch(batch, decided)              # the cycle's one host transfer

The rule is runtime/verify/acceptance.py's, batched (gpu_kernels/reference.py states it and tests it against
the per-row walk with the same uniforms): greedy at temperature 0; SpecInfer's multi-step rejection sampling
at temperature > 0, exact for any tree given the law q each drafted token was drawn from (None = point
masses, as n-gram children are). Chains of one shape take the chain kernels, other trees the tree ones;
both consume the same uniforms and agree except, through float rounding, exactly at a decision boundary.

Randomness: each row draws n + 1 uniforms per cycle from its own generator (n = its tree's node count):
u[c] tests node c (u[0], the root's, is unused) and u[n] draws the recovered or bonus token by inverse
CDF. A row's stream therefore does not depend on the other rows of its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith import kernels
from draftsmith.runtime.verify.acceptance import Verdict, sanitize
from draftsmith.runtime.verify.draft_batch import DraftBatch
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs


@dataclass
class Decided:
    """Acceptance's result, on the device: accepted counts [B], next tokens [B] and, for trees, the
    accepted node ids [B, D] (-1 past the path; None for a chain: nodes 1..count)."""

    count: torch.Tensor
    next_token: torch.Tensor
    path: torch.Tensor | None


def accept_batch(
    batch: DraftBatch,
    logits: torch.Tensor,  # [B, N, V] float32, the target's after each node (N = the largest tree)
    params: SamplingParams,
    generators: list[torch.Generator] | None,
) -> Decided:
    parents, tokens, chain_len = batch.parents, batch.tokens, batch.chain  # [B, N] each
    if params.greedy:
        if chain_len is not None:
            num, nxt = kernels.chain_accept_greedy(logits[:, : chain_len + 1], tokens[:, 1 : chain_len + 1])
            return Decided(num, nxt, None)
        path, num, nxt = kernels.tree_accept_greedy(parents, tokens, logits)
        return Decided(num, nxt, path)
    probs = sanitize(logits_to_probs(logits, params))  # [B, N, V], as plain sampling processes them
    coins, draws = uniforms(generators, batch.sizes, logits.shape[1], logits.device)
    draft_probs = batch.q
    if chain_len is not None and draft_probs is not None:
        k1 = chain_len + 1
        num, nxt = kernels.chain_accept(
            probs[:, :k1], draft_probs[:, 1:k1], tokens[:, 1:k1], coins[:, 1:k1], draws
        )
        return Decided(num, nxt, None)
    path, num, nxt = kernels.tree_accept(parents, tokens, probs, draft_probs, coins, draws)
    return Decided(num, nxt, path)


def uniforms(
    generators: list[torch.Generator] | None, sizes: list[int], nodes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """coins [B, N] (node c's test; 1.0 past a row's tree) and draws [B], from each row's own stream."""
    if generators is None or len(generators) != len(sizes):
        raise ValueError("sampling needs one generator per row")
    coins = torch.ones(len(sizes), nodes, dtype=torch.float32, device=device)
    draws = torch.empty(len(sizes), dtype=torch.float32, device=device)
    for b, (g, n) in enumerate(zip(generators, sizes, strict=True)):
        u = torch.rand(n + 1, generator=g, device=g.device)
        coins[b, :n], draws[b] = u[:n], u[n]
    return coins, draws


@dataclass
class Fetched:
    """What the host learns of a cycle, per row: the Verdict (accepted node ids, the added token), the
    tokens to commit (the accepted ones, then the added one), the tree's depth, the drafter's columns."""

    verdicts: list[Verdict]
    tokens: list[list[int]]
    depths: list[int]
    fetched: list[list[int]]


def fetch(batch: DraftBatch, decided: Decided) -> Fetched:
    """The cycle's one host synchronization: everything in one [B, 3 + 2D + X] transfer."""
    count, nxt = decided.count, decided.next_token
    if decided.path is None:  # a chain: nodes 1..count
        path = torch.arange(1, batch.chain + 1, device=count.device).expand(len(batch.sizes), -1)
        path = torch.where(path <= count[:, None], path, -1)
    else:
        path = decided.path
    tokens = batch.tokens.gather(1, path.clamp(min=0))  # [B, D]
    depth = batch.depths.max(dim=1).values
    extra = [] if batch.fetched is None else [batch.fetched]
    rows = torch.cat([count[:, None], nxt[:, None], depth[:, None], path, tokens, *extra], dim=1).tolist()
    width = path.shape[1]
    return Fetched(
        [Verdict(row[3 : 3 + row[0]], row[1]) for row in rows],
        [row[3 + width : 3 + width + row[0]] + [row[1]] for row in rows],
        [row[2] for row in rows],
        [row[3 + 2 * width :] for row in rows],
    )
