"""Confidence-driven verification: each row verifies the prefix of its drafted chain that pays best per unit
of measured verify cost, chosen by a stopping rule from the drafter's survival estimates.

    policy = AdaptiveVerify(costs, max_depth=5)                                  # --tree adaptive:5
    generate_speculative(target, drafter, prompts, params, policy=policy)

Two decisions a cycle. Before drafting, the depth k0 in 0..K that pays on average: load-aware speculation's
rule (runtime/verify/load_aware.py: observed conditional acceptance per position, the measured verify curve
and the draft's own measured cost; k0 = 0 is a plain step with nothing drafted). After drafting the chain of
k0, each row b has survival estimates s_1..s_k0, s_i = P(node i is accepted | node i-1 was): the drafter's
own (`DraftBatch.survival`, DSpark's confidence head), else the conditional acceptance observed so far at
each position, and keeps the prefix a stopping rule picks. `adaptive:K,survival=SOURCE` picks the source:
`auto` (the default: the drafter's where it gives one), `confidence` (a confidence head's; a draft without
one is refused before anything loads, runtime/speculator.py) or `observed` (the observed acceptance even
where the drafter gives estimates). Observed rates are every row's, so with them runtime/speculator.py runs
load-aware speculation alone (the second decision would repeat the first); this policy serves a drafter's
own estimates, which exist only once it has drafted. The budget cuts a chain: a tree shape (`static:`,
`dynamic:`, a kind's own) has no per-row prefix to keep, so `adaptive:` takes K and this option only. With
g_i = s_1 ... s_i, a prefix of k nodes yields E_k = 1 + g_1 + ... + g_k tokens (the target's own token
counted) and verifying it costs C_k = verify(batch, k + 1), the measured curve (the draft is already paid
for). The row keeps node i while E_i / C_i > E_{i-1} / C_{i-1}, and stops at the first node that does not
pay (vLLM's adaptive verification picks the budget maximizing accepted tokens per millisecond the same way,
vllm#47808; SpecDec++ stops drafting on a predicted rejection, arXiv 2405.19715).

Why it stays lossless. The depth drafted depends on earlier cycles only. The decision to verify node i
reads s_1..s_i only, and each s_j is a function of node j's law and its ancestors, never of node j's own
sampled token (the contract of DraftBatch.survival), so the decision is taken before node i's token is
looked at: a stopping time, as if the drafter had drafted fewer tokens. A rule that looks at a sampled token
does bias the law: K = 1, p = q = (1/2, 1/2), verifying the draft only when it drew `a` emits `a` with
probability 1/2 + 1/2 * 1/2 = 3/4 (tests/runtime/test_adaptive.py has it as the negative control). At T = 0
every prefix is exact (greedy verification keeps the target's argmax).

The kept lengths come back to the host (one small transfer a cycle beyond the cycle's own), so the verify
forward is only as wide as the longest kept prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.runtime.verify.draft_batch import DraftBatch
from draftsmith.runtime.verify.load_aware import (  # noqa: F401 (parse_adaptive, SURVIVAL_SOURCES: re-exported)
    SURVIVAL_SOURCES,
    AcceptanceTally,
    LoadAwareDepth,
    VerifyCosts,
    parse_adaptive,
)


def prefix_lengths(survival: torch.Tensor, verify_costs: torch.Tensor) -> torch.Tensor:
    """survival [B, K] (s_i given node i-1 accepted), verify_costs [K + 1] (C_0..C_K: verifying k drafted
    nodes plus the root) -> the nodes each row keeps [B] long, by the stopping rule above."""
    expected = 1.0 + survival.cumprod(dim=-1).cumsum(dim=-1)  # [B, K]: E_1..E_K
    ratio = torch.cat([torch.ones_like(expected[:, :1]), expected], dim=-1) / verify_costs  # [B, K + 1]
    pays = ratio[:, 1:] > ratio[:, :-1]  # [B, K]: node i pays (strictly), given nodes < i were kept
    return pays.long().cumprod(dim=-1).sum(dim=-1)  # [B]: nodes kept before the first that does not pay


@dataclass
class AdaptiveVerify:
    """The policy of `--tree adaptive:K` for one batch size: draft the chain load-aware speculation picks
    before drafting (0..K, the draft's cost counted, from the acceptance observed so far), then verify per
    row the prefix the stopping rule keeps from the drafter's survival estimates."""

    costs: VerifyCosts
    max_depth: int
    source: str = "auto"  # where the survival estimates come from (SURVIVAL_SOURCES, load_aware.py)
    step_cost: float = 0.0  # the drafter's prior cost per drafted level (Drafter.step_cost)
    # the chain drafted and the observed acceptance (None: load-aware speculation's over `costs`, `step_cost`)
    depth_rule: LoadAwareDepth | None = None
    depth_counts: list[int] = field(init=False)  # how often each kept length was verified (all rows)
    kept: list[int] = field(default_factory=list, init=False)  # the last cycle's kept lengths per row

    def __post_init__(self) -> None:
        if self.depth_rule is None:
            self.depth_rule = LoadAwareDepth(self.costs, self.max_depth, step_cost=self.step_cost)
        self.depth_counts = [0] * (self.max_depth + 1)

    @property
    def tally(self) -> AcceptanceTally:
        return self.depth_rule.tally

    def rates(self) -> list[float]:
        return self.depth_rule.rates()

    def choose(self, batch: int) -> int:
        """The chain every row drafts, chosen before drafting: a drafter's own estimates exist only once it
        has drafted, so the depth that pays on average (K = 0: a plain step, nothing drafted) is taken
        first and the rows' estimates cut it after (BENCHMARKS.md: drafting K always, then cutting, ran
        at 0.70-0.84x plain with a DSpark head whose position 1 accepts 0.2)."""
        return self.depth_rule.choose(batch)

    def budget(self, drafts: DraftBatch, batch: int) -> DraftBatch:
        """The drafted chains cut to the prefixes the stopping rule keeps (the cycle's extra transfer); a
        probe cycle keeps its node, so the acceptance it measures is every row's."""
        whole = drafts.max_depth == 0 or self.depth_rule.probing
        if whole:
            self.kept = [n - 1 for n in drafts.sizes]
        else:
            self.kept = [min(k, n - 1) for k, n in zip(self.cut(drafts, batch).tolist(), drafts.sizes)]
        for k in self.kept:
            self.depth_counts[k] += 1
        return drafts if whole else drafts.prefixes(self.kept)

    def cut(self, drafts: DraftBatch, batch: int) -> torch.Tensor:
        """The nodes each row keeps [B] by the stopping rule, from its survival estimates [B, K]."""
        depth = drafts.max_depth
        if drafts.survival is not None and self.source != "observed":
            survival = drafts.survival[:, 1 : depth + 1].float()  # [B, K]
        else:
            observed = torch.tensor(self.rates()[:depth], device=drafts.device)
            survival = observed.expand(len(drafts.sizes), depth)  # [B, K]
        costs = torch.tensor([self.costs(batch, n) for n in range(1, depth + 2)], device=drafts.device)
        return prefix_lengths(survival, costs)

    def observe(
        self, batch: int, depth: int, accepted_lengths: list[int], draft_s: float, rows=None, catch_up=False
    ) -> None:
        """After a cycle, for the running `rows` of the batch (accepted_lengths in their order): node j + 1 of
        a row was tried iff the row kept it and nodes <= j were accepted (`catch_up`: LoadAwareDepth's)."""
        kept = self.kept if rows is None else [self.kept[i] for i in rows]
        self.depth_rule.observe(batch, depth, accepted_lengths, draft_s, kept=kept, catch_up=catch_up)
