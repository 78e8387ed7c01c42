"""SSD's outcome prediction: how many candidates each accepted length gets, and hit accounting.

Speculative speculative decoding (Kumar, Dao and May, ICLR 2026, arXiv 2603.03251) pre-drafts cycle i+1
while the target verifies cycle i, for the outcomes it predicts: an accepted length a in 0..K and the token
the target adds after it (the recovered token after a rejection at a < K, the bonus token at a = K). The
candidates for that token are the drafter's top-ranked tokens at position a + 1; how many each length gets
is the fan-out F_a, within a budget B = sum_a F_a.

    plan = geometric_fanout(budget=8, depth=3, alpha=0.6)     # -> [F_0, F_1, F_2, F_3], sum 8
    estimate = AcceptanceEstimate(); estimate.observe(accepted=2, depth=3); estimate.alpha

Why geometric: with per-token acceptance alpha, P(a) = (1 - alpha) alpha^a for a < K and alpha^K for a = K.
The paper measures a miss probability that falls as a power law in F (miss ~ F^-r); maximizing
sum_a P(a) (1 - F_a^-r) under sum_a F_a = B gives F_a proportional to P(a)^(1/(1+r)), a geometric series in
a (capped at the last length, which collects the tail). `exponent` is 1/(1+r); 0.5 (r = 1) by default.
Every length keeps at least one candidate, so a budget below K + 1 is refused.

`saguaro_law` is the paper's draft-law adjustment (the one torch function here). The runtime
(runtime/drafters/ssd.py) and the replay simulator (runtime/bench/ssd_replay.py) share this
planner and estimate, so a replayed trace hits exactly where the run did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.runtime.errors import BadInputError

DEFAULT_EXPONENT = 0.5  # 1 / (1 + r) with a miss power law F^-1


def check_budget(budget: int, depth: int, field_name: str = "--ssd-fanout") -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < depth + 1:
        raise BadInputError(
            field_name,
            budget,
            f"an integer >= {depth + 1}: one candidate for each accepted length 0..{depth} of the chain",
        )
    return budget


def length_law(alpha: float, depth: int) -> list[float]:
    """P(accepted length = a), a = 0..depth, for i.i.d. acceptance with rate alpha."""
    return [(1 - alpha) * alpha**a for a in range(depth)] + [alpha**depth]


def geometric_fanout(budget: int, depth: int, alpha: float, exponent: float = DEFAULT_EXPONENT) -> list[int]:
    """F_a for a = 0..depth, each >= 1, summing to `budget`: one each, the rest by largest remainder of
    budget * w_a / sum(w), w_a = P(a)^exponent (ties to the shorter length)."""
    check_budget(budget, depth)
    weights = [max(p, 1e-12) ** exponent for p in length_law(min(max(alpha, 0.0), 1.0), depth)]
    spare = budget - (depth + 1)
    shares = [spare * w / sum(weights) for w in weights]
    fan = [1 + int(s) for s in shares]
    order = sorted(range(depth + 1), key=lambda a: (-(shares[a] - int(shares[a])), a))
    for a in order[: budget - sum(fan)]:
        fan[a] += 1
    return fan


def branch_order(fan: list[int], alpha: float) -> list[tuple[int, int]]:
    """The planned branches (accepted length a, candidate rank r < F_a), most likely first: by
    P(a) / (r + 1) (a candidate's chance falls with its rank; ties: shorter length, lower rank). A drafter
    that must stop early (the verdict arrived) has drafted the likeliest outcomes."""
    law = length_law(min(max(alpha, 0.0), 1.0), len(fan) - 1)
    plan = [(a, r) for a, count in enumerate(fan) for r in range(count)]
    return sorted(plan, key=lambda ar: (-law[ar[0]] / (ar[1] + 1), ar))


@dataclass
class AcceptanceEstimate:
    """Running per-token acceptance rate with a Beta(1, 1) prior: accepted tokens over tried positions (a
    cycle that accepts a < K tokens tried a + 1 positions; a full accept tried K)."""

    accepted: int = 0
    tried: int = 0

    @property
    def alpha(self) -> float:
        return (self.accepted + 1) / (self.tried + 2)

    def observe(self, accepted: int, depth: int) -> None:
        self.accepted += accepted
        self.tried += min(accepted + 1, depth)


def saguaro_law(q: torch.Tensor, top: int, scale: float) -> torch.Tensor:
    """SSD's draft-law adjustment ("Saguaro sampling"): the `top` likeliest tokens of q [..., V] get their
    mass scaled by `scale` (< 1), then q is renormalized. After a rejection the residual norm((p - q)+)
    then puts more mass on exactly those tokens, which are the cached candidates, so more outcomes hit; fewer
    drafted tokens are accepted. Lossless only if the adjusted law is the one drafted from AND recorded."""
    if scale >= 1.0 or top <= 0:
        return q
    idx = torch.topk(q, min(top, q.shape[-1]), dim=-1).indices
    factor = torch.ones_like(q).scatter_(-1, idx, scale)
    out = q * factor
    return out / out.sum(dim=-1, keepdim=True)


def rank_of(token: int, ranked: list[int]) -> int:
    """The token's index among the ranked candidates, -1 when absent."""
    return ranked.index(token) if token in ranked else -1


@dataclass
class HitStats:
    """Per accepted length a: cycles whose outcome had that length, and how many found their draft cached;
    plus the candidate rank of every outcome's token (-1 = not among the ranked candidates)."""

    depth: int
    cycles: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cycles = self.cycles or [0] * (self.depth + 1)
        self.hits = self.hits or [0] * (self.depth + 1)

    def record(self, accepted: int, rank: int, hit: bool) -> None:
        self.cycles[accepted] += 1
        self.hits[accepted] += int(hit)
        self.ranks.append(rank)

    @property
    def hit_rate(self) -> float:
        return sum(self.hits) / max(sum(self.cycles), 1)

    @property
    def hit_rate_per_position(self) -> list[float | None]:
        """[a] = share of the cycles that accepted a tokens whose next draft was cached (None: no such
        cycle)."""
        return [h / c if c else None for h, c in zip(self.hits, self.cycles, strict=True)]
