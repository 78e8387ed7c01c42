"""Acceptance rules: which drafted tree nodes the target accepts, and the one token it adds (pure torch).

One speculative cycle verifies a tree (node 0 = root, the last committed token) in one target forward,
which gives the target's distribution after every node. The rules here walk the tree from the root:

    greedy (temperature 0)   accept a child while its token is the target's argmax at its parent
                             (first index on ties, exactly as plain greedy decoding), then emit the
                             argmax at the last accepted node.
    sampling (temperature>0) at the current node, visit its children in order with the residual r = p:
                             child i (token x, drawn from q_i) is accepted with probability
                             min(1, r(x) / q_i(x)); on rejection r <- norm((r - q_i)+) and the next
                             sibling is tried; if every child is rejected, emit a draw from r.

The sampling rule is exact for any tree (Leviathan et al. 2023 / Chen et al. 2023 for a chain; SpecInfer's
multi-step speculative sampling, Miao et al. 2024, for siblings), given that q_i is the distribution
child i was actually drawn from:
    - a chain drafted by sampling: one child per node, q = the drafter's processed distribution;
    - i.i.d. sampled siblings: q_i = q for every sibling (SpecInfer);
    - siblings sampled without replacement: q_i = q with earlier siblings masked out, renormalized
      (Recursive Speculative Decoding, Jeon et al. 2024);
    - deterministic children (top-k, n-gram lookup): q_i is a point mass at x, so child i is accepted
      with probability r(x) and rejection zeroes x in r. Pass `draft_probs=None` for this case. It equals
      "draw y from p, descend if y is a child", so it is exact for any choice of children.
When every node on the path is accepted, the token drawn at the leaf comes from p at that leaf (the
bonus token): the same loop, with no children left to try.

Randomness enters only through two callables, `coin(prob) -> bool` and `draw(dist) -> token`, so the
exact float64 enumeration test (tests/runtime/test_acceptance_laws.py) runs this very code over every
branch. The walk keeps the dtype it is given (no silent casts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Coin = Callable[[torch.Tensor], bool]  # accept with this probability (a 0-d tensor in [0, 1])
Draw = Callable[[torch.Tensor], int]  # one token from a distribution [V]


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # accepted drafted node ids, root to leaf (the root itself is not listed)
    next_token: int  # recovered token (after a rejection) or bonus token (at a leaf)


def children_lists(parents: Sequence[int]) -> list[list[int]]:
    """children[i] = the node ids whose parent is i, in increasing order (the drafter's sibling order)."""
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def accept_greedy(parents: Sequence[int], tokens: Sequence[int], logits: torch.Tensor) -> Verdict:
    """tokens [N] (tokens[0] = root), logits [N, V] the target's logits after each node."""
    best = logits.argmax(dim=-1).tolist()  # [N]; first index on ties, as torch.argmax and generate()
    children = children_lists(parents)
    node, accepted = 0, []
    while True:
        match = next((c for c in children[node] if tokens[c] == best[node]), None)
        if match is None:
            return Verdict(accepted, best[node])
        accepted.append(match)
        node = match


def accept_sampled(
    parents: Sequence[int],
    tokens: Sequence[int],
    target_probs: torch.Tensor,  # [N, V] p after each node (processed exactly as plain sampling)
    draft_probs: torch.Tensor | None,  # [N, V] q_i each node was drawn from; None = point masses
    coin: Coin,
    draw: Draw,
) -> Verdict:
    children = children_lists(parents)
    vocab = target_probs.shape[-1]
    node, accepted = 0, []
    while True:
        residual = sanitize(target_probs[node])
        for child in children[node]:
            token = tokens[child]
            if not 0 <= token < vocab:  # a placeholder (-1) or out-of-range id is never accepted
                continue
            q = None if draft_probs is None else draft_probs[child]
            if coin(acceptance_probability(residual, q, token)):
                accepted.append(child)
                node = child
                break
            residual = updated_residual(residual, q, token)
        else:
            return Verdict(accepted, draw(residual))


def acceptance_probability(residual: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """min(1, r(x) / q(x)); a point mass (q None) has q(x) = 1."""
    if q is None:
        return residual[token].clamp(max=1.0)
    q_x = q[token]
    if q_x <= 0:  # the drafter could not have drawn x: never accept it
        return torch.zeros((), dtype=residual.dtype)
    return (residual[token] / q_x).clamp(max=1.0)


def updated_residual(residual: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm((r - q)+): the law of the target's token given that this child was rejected."""
    if q is None:
        new = residual.clone()
        new[token] = 0
    else:
        new = (residual - q).clamp(min=0)
    total = new.sum()
    if not total > 0:
        # r <= q everywhere can only come from rounding (r and q both sum to 1, so then r == q and x
        # is accepted with probability 1 in exact arithmetic); keep r rather than divide by zero.
        return residual
    return new / total


def sanitize(dist: torch.Tensor) -> torch.Tensor:
    """Distributions [..., V] with no NaN and positive mass: NaN/inf/negative entries become 0, each row is
    renormalized, and a row with no mass left becomes uniform (so a broken target row still yields an
    in-range token). The batched engine (batch_accept.py) uses it on [B, N, V]."""
    out = torch.nan_to_num(dist, nan=0.0, posinf=0.0, neginf=0.0).clamp_(min=0)  # one copy, then in place
    total = out.sum(dim=-1, keepdim=True)  # [..., 1]
    empty = total <= 0
    out.div_(total.masked_fill(empty, 1.0))
    return out.masked_fill_(empty, 1.0 / dist.shape[-1])


def generator_coin(generator: torch.Generator) -> Coin:
    """coin(prob): one uniform from the row's generator, accept iff u < prob."""

    def coin(prob: torch.Tensor) -> bool:
        u = torch.rand((), generator=generator, device=generator.device)
        return bool(u < prob)

    return coin


def generator_draw(generator: torch.Generator) -> Draw:
    def draw(dist: torch.Tensor) -> int:
        return int(torch.multinomial(dist, 1, generator=generator))

    return draw
