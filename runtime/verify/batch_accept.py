"""The acceptance step for a whole batch in one call to draftsmith.kernels (Triton on CUDA, the torch
references elsewhere), with one host synchronization per cycle.

    verdicts = accept_batch(drafts, logits, params, generators)     # logits [B, N, V] after every node

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

import torch

from draftsmith import kernels
from draftsmith.runtime.drafters.drafter import Draft
from draftsmith.runtime.verify.acceptance import Verdict, sanitize
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs


def accept_batch(
    drafts: list[Draft],
    logits: torch.Tensor,  # [B, N, V] float32, the target's after each node (N = the largest tree)
    params: SamplingParams,
    generators: list[torch.Generator] | None,
) -> list[Verdict]:
    parents, tokens = tree_tensors(drafts, logits.shape[1], logits.device)  # [B, N] each
    chain_len = common_chain(drafts)
    if params.greedy:
        if chain_len is not None:
            num, nxt = kernels.chain_accept_greedy(logits[:, : chain_len + 1], tokens[:, 1 : chain_len + 1])
            return verdicts_from(None, num, nxt)
        return verdicts_from(*kernels.tree_accept_greedy(parents, tokens, logits))
    probs = sanitize(logits_to_probs(logits, params))  # [B, N, V], as plain sampling processes them
    draft_probs = stacked_draft_probs(drafts, tokens, probs.shape)
    coins, draws = uniforms(generators, [d.tree.size for d in drafts], logits.shape[1], logits.device)
    valid_tokens = bool(((tokens >= 0) & (tokens < probs.shape[-1])).all())
    if chain_len is not None and draft_probs is not None and valid_tokens:
        k1 = chain_len + 1
        num, nxt = kernels.chain_accept(
            probs[:, :k1], draft_probs[:, 1:k1], tokens[:, 1:k1], coins[:, 1:k1], draws
        )
        return verdicts_from(None, num, nxt)
    return verdicts_from(*kernels.tree_accept(parents, tokens, probs, draft_probs, coins, draws))


def tree_tensors(drafts: list[Draft], nodes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [B, N] (-1 for the root and the padding) and tokens [B, N] (-1 = padding / placeholder)."""
    parents = torch.full((len(drafts), nodes), -1, dtype=torch.long)
    tokens = torch.full((len(drafts), nodes), -1, dtype=torch.long)
    for b, draft in enumerate(drafts):
        parents[b, : draft.tree.size] = torch.tensor(draft.tree.parents)
        tokens[b, : draft.tree.size] = torch.tensor(draft.tokens)
    return parents.to(device), tokens.to(device)


def common_chain(drafts: list[Draft]) -> int | None:
    """K when every row drafted the same chain of K >= 1 tokens, else None."""
    trees = {d.tree.parents for d in drafts}
    if len(trees) != 1:
        return None
    parents = next(iter(trees))
    k = len(parents) - 1
    return k if k >= 1 and parents == tuple(range(-1, k)) else None


def stacked_draft_probs(drafts: list[Draft], tokens: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """q [B, N, V] float32, zero past each row's tree; None when every row's children are point masses.
    A row without q among rows with it gets its point masses as one-hot rows (the same rule)."""
    if all(d.draft_probs is None for d in drafts):
        return None
    q = torch.zeros(shape, dtype=torch.float32, device=tokens.device)
    for b, draft in enumerate(drafts):
        n = draft.tree.size
        if draft.draft_probs is not None:
            q[b, :n] = draft.draft_probs.to(device=q.device, dtype=torch.float32)
        else:
            valid = (tokens[b, 1:n] >= 0) & (tokens[b, 1:n] < shape[-1])
            rows = torch.arange(1, n, device=q.device)[valid]
            q[b, rows, tokens[b, rows]] = 1.0
    return q


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


def verdicts_from(path: torch.Tensor | None, num: torch.Tensor, nxt: torch.Tensor) -> list[Verdict]:
    """Device results -> per-row Verdicts with one host synchronization. path None = a chain (node ids
    1..num)."""
    columns = [num[:, None], nxt[:, None]] + ([] if path is None else [path])
    rows = torch.cat(columns, dim=1).tolist()
    if path is None:
        return [Verdict(list(range(1, n + 1)), t) for n, t, *_ in rows]
    return [Verdict(rest[:n], t) for n, t, *rest in rows]
