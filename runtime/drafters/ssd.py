"""SSD in process (`--ssd`): pre-draft the next cycle for the predicted outcomes of this one, take the cached
draft on a hit, draft normally on a miss.

    drafter = SsdDrafter(lambda tree: lm_drafter(target, tree, num_layers=2), depth=3, budget=8)
    results = generate_speculative(target, drafter, prompts, params)     # the ordinary engine loop
    drafter.batch_metrics()[0]["hit_rate_per_position"]

Speculative speculative decoding (Kumar, Dao and May, ICLR 2026, arXiv 2603.03251): after drafting cycle i
(a chain of K tokens), predict its outcomes v = (accepted length a, the token the target adds after the
accepted prefix) and draft cycle i+1 for each into a cache keyed by v. The target's law at the added token
is unknown before verification, so the predictor is the drafter's own law at each position (its top-ranked
tokens; a drafted token is left out where a point-mass rejection zeroes it), with the geometric fan-out of
runtime/verify/ssd_fanout.py over a = 0..K within the budget `--ssd-fanout`.

Here everything runs synchronously in one process (the branches are drafted right after the draft they
follow, before its verification), which is what proves the bookkeeping lossless: each branch is the inner
drafter's ordinary `commit` + `propose` on a copy of its state, so a cached draft is exactly the draft the
inner drafter would have made in that state, and every drafted token's q is the law it was drawn from (the
inner drafter's own sampling). A branch's draft is drawn with the drafter's random stream before the target
verifies anything, so it is independent of the verifier's coins; which branch is used depends on the
outcome, but each branch is a draw from q given its own context, the context that then holds. runtime/
drafters/draft_process.py runs the same logic in its own process, overlapping the target's verification.

Saguaro sampling (`saguaro` < 1, the paper's draft-law adjustment, ssd_fanout.saguaro_law): a sampled
chain draws each token from q with its F_a planned candidates' mass scaled down, and that adjusted q is
what the verifier gets, so rejections land on cached candidates more often; still exact.

Rows each get their own inner drafter (batch 1), because branches fork one row's state. LM drafters draft a
chain of K + 1 internally (one more draft forward) so that the law at position K + 1, where a full accept's
bonus token lands, is known; only K tokens go to the verifier. Drafters without a model (n-gram) rank
candidates by what followed the same token earlier in the context. Feature heads (EAGLE-3, MTP, Medusa) read
target features of the accepted tokens, which a branch cannot have before verification, so they are refused.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.ssd_fanout import (
    DEFAULT_EXPONENT,
    AcceptanceEstimate,
    HitStats,
    branch_order,
    check_budget,
    geometric_fanout,
    rank_of,
    saguaro_law,
)
from draftsmith.runtime.verify.tree import TreeSpec, chain

RANKED = 32  # candidates ranked per position (the trace's ranks; a token past them reads -1)


@dataclass
class Branch:
    draft: Draft  # the inner drafter's draft for this outcome
    state: object  # the inner drafter's state right after drafting it (Drafter.state)
    fetched: list[int] | None  # the draft's `fetched` columns, for the inner drafter's commit


def draft_one(inner: Drafter, ctx: list[int]) -> tuple[Draft, list[int] | None]:
    """The inner drafter's draft for one row, on the host, with its `fetched` columns."""
    batch = inner.propose([ctx], inner.tree)
    fetched = None if batch.fetched is None else batch.fetched[0].tolist()
    return batch.to_drafts()[0], fetched


@dataclass
class Row:
    inner: Drafter
    ranked: list[list[int]] = field(default_factory=list)  # [a] candidates for the token after a accepted
    cache: dict[tuple[int, int], Branch] = field(default_factory=dict)
    base: object = None  # the inner state after the draft in flight (a miss resumes from it)
    accepted: list[int] | None = None  # the verdict of the draft in flight, once committed
    features: torch.Tensor | None = None
    record: dict | None = None
    context: list[int] = field(default_factory=list)  # the context of the draft in flight
    full: Draft | None = None  # that draft as the inner drafter made it (K + 1 tokens for LM drafters)
    fetched: list[int] | None = None  # its `fetched` columns


def clone_factory(proto: Drafter) -> Callable[[TreeSpec], Drafter]:
    """Inner drafters sharing one built drafter's weights, each with its own tree (Drafter.fork)."""
    return proto.fork


def truncate(draft: Draft, depth: int) -> Draft:
    """The first `depth` drafted tokens of a chain (root included), with their laws."""
    n = min(draft.tree.size, depth + 1)
    probs = None if draft.draft_probs is None else draft.draft_probs[:n]
    return Draft(chain(n - 1), draft.tokens[:n], probs)


def context_candidates(context: list[int], count: int) -> list[int]:
    """Tokens that followed the context's last token earlier in it, most frequent first (then most
    recent): the n-gram drafter's stand-in for a law."""
    last, follows = context[-1], Counter()
    for i in range(len(context) - 2, -1, -1):
        if context[i] == last:
            follows[context[i + 1]] += 1
    recency = {tok: -i for i, tok in enumerate(reversed(context))}
    return sorted(follows, key=lambda t: (-follows[t], -recency.get(t, 0)))[:count]


class SsdDrafter(Drafter):
    def __init__(
        self,
        make_inner: Callable[[TreeSpec], Drafter],
        depth: int,
        budget: int,
        exponent: float = DEFAULT_EXPONENT,
        saguaro: float = 1.0,
    ):
        super().__init__()
        self.budget = check_budget(budget, depth)
        if not isinstance(saguaro, (int, float)) or not 0.0 < saguaro <= 1.0:
            raise BadInputError("--ssd-saguaro", saguaro, "a number in (0, 1] (1 = the drafter's own law)")
        self.saguaro = float(saguaro)
        probe = make_inner(chain(depth))
        if probe.capture_layers:
            raise BadInputError(
                "--ssd",
                probe.name,
                "a drafter of the committed tokens only (ngram, self:layers=N, model:TARGET)",
                "feature heads read the target's features of accepted tokens, unknown before verification",
            )
        # LM drafters (and any drafter with `ranks_levels`) rank candidates on their per-level logits
        self.has_laws = isinstance(probe, ModelDrafter) or getattr(probe, "ranks_levels", False)
        self.inner_tree = chain(depth + 1) if self.has_laws else chain(depth)
        self.make_inner, self.depth, self.exponent = make_inner, depth, exponent
        self.tree = chain(depth)
        self.name = f"ssd:{probe.name}"
        self.step_cost = probe.step_cost
        self.trace: list[dict] = []  # one record per verified cycle (runtime/bench/ssd_replay.py reads it)
        self._metrics: list[dict] = []
        self.rows: list[Row] = []

    # ---- the protocol ------------------------------------------------------------------------------------
    def start(self, prompts, params, generators, features=None, static_slots=None) -> None:
        if self.rows:
            self._metrics.append(self._batch_metrics())
            self._left_forwards += sum(row.inner.forwards for row in self.rows)
        super().start(prompts, params, generators, features)
        self.stats, self.estimate = HitStats(self.depth), AcceptanceEstimate()
        self.times = {"draft_s": 0.0, "drafts": 0, "spec_s": 0.0, "branches": 0, "verify_s": 0.0}
        self.rows = []
        for b, prompt in enumerate(prompts):
            inner = self.make_inner(self.inner_tree)
            inner.start([prompt], params, None if generators is None else [generators[b]])
            self.rows.append(Row(inner))

    def propose(self, contexts: list[list[int]], tree: TreeSpec | None = None) -> DraftBatch:
        """This cycle's drafts (always a chain of `depth`); in process, the next cycle's branches are
        drafted right away (a drafter process sets `defer` and calls `speculate` after sending the
        drafts, while the target verifies)."""
        drafts = [self._propose_row(row, ctx) for row, ctx in zip(self.rows, contexts, strict=True)]
        if not self.defer:
            self.speculate()
        self.proposed_at = time.perf_counter()
        return DraftBatch.from_drafts(drafts, self.device)

    device = "cpu"  # where its DraftBatch goes (the engine moves it to the target's device)

    def speculate(self, stop: Callable[[], bool] | None = None) -> None:
        """Draft the planned branches of every row, likeliest first; `stop()` (checked before each
        branch) ends it early, e.g. when the target's verdict has arrived."""
        for row in self.rows:
            spec_s, branches = self._speculate(row, row.context, row.full, stop)
            row.record |= {"spec_s": spec_s, "spec_branches": branches}
        self.forwards = sum(row.inner.forwards for row in self.rows) + self._left_forwards

    defer = False

    def commit(self, accepted: list[list[int]], features=None, fetched=None) -> None:
        verify_s = time.perf_counter() - self.proposed_at
        self.times["verify_s"] += verify_s
        for b, (row, acc) in enumerate(zip(self.rows, accepted, strict=True)):
            row.accepted, row.features = acc, None if not features else features[b]
            row.record |= {"accepted": len(acc), "verify_s": verify_s}
            self.trace.append(row.record)
            self.estimate.observe(len(acc), self.depth)

    def ended(self, rows: list[int]) -> None:
        for r in rows:  # each row's drafter holds one row
            self.rows[r].inner.ended([0])

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        gone = [r for r in range(len(self.rows)) if r not in rows]
        self._left_forwards += sum(self.rows[r].inner.forwards for r in gone)
        self.rows = [self.rows[r] for r in rows]

    _left_forwards = 0

    # ---- one row's cycle ---------------------------------------------------------------------------------
    def _adjust(self, row: Row) -> None:
        """Saguaro sampling (< 1): at depth d the drafted token's law has its F_d likeliest tokens scaled,
        F_d the fan-out planned for accepted length d, so a rejection there lands on cached candidates."""
        if self.saguaro < 1.0:
            fan = geometric_fanout(self.budget, self.depth, self.estimate.alpha, self.exponent)
            scale = self.saguaro
            row.inner.law_adjust = lambda d, q: saguaro_law(q, fan[d] if d < len(fan) else 0, scale)

    def _propose_row(self, row: Row, ctx: list[int]) -> Draft:
        start = time.perf_counter()
        branch = self._lookup(row, ctx) if row.accepted is not None else None
        if branch is not None:  # the draft is ready: the inner drafter continues from that branch
            row.inner.restore(branch.state)
            (full, fetched), draft_s = (branch.draft, branch.fetched), None
        else:
            if row.accepted is not None:  # a miss: back to the verified draft's state, then as usual
                row.inner.restore(row.base)
                features = None if row.features is None else [row.features]
                row.inner.commit([row.accepted], features, [row.fetched])
            self._adjust(row)
            full, fetched = draft_one(row.inner, ctx)
            draft_s = time.perf_counter() - start
            self.times["draft_s"] += draft_s
            self.times["drafts"] += 1
        row.accepted, row.context, row.full, row.fetched = None, ctx, full, fetched
        row.ranked = self._ranked(row.inner, full, ctx)
        row.record = {"depth": self.depth, "rank": -1, "draft_s": draft_s, "hit": branch is not None}
        self.forwards = sum(row.inner.forwards for row in self.rows) + self._left_forwards
        return truncate(full, self.depth)

    def _lookup(self, row: Row, ctx: list[int]) -> Branch | None:
        """The verified outcome (a, the token after the accepted prefix = the context's new last token)
        -> its cached branch, recording the hit (or miss) and the token's rank."""
        a, token = len(row.accepted), ctx[-1]
        rank = rank_of(token, row.ranked[a])
        branch = row.cache.get((a, token))
        self.stats.record(a, rank, branch is not None)
        row.record["rank"] = rank  # the record is the trace's entry for the verified cycle
        row.cache = {}
        return branch

    def _ranked(self, inner: Drafter, full: Draft, ctx: list[int]) -> list[list[int]]:
        """[a] for a = 0..K: the candidates for the token the target adds after a accepted drafted tokens.
        A point-mass draft's token at a + 1 is left out for a < depth: a rejection zeroes it."""
        depth = min(full.tree.max_depth, self.depth)
        ranked = []
        for a in range(self.depth + 1):
            if a > depth:
                ranked.append([])
                continue
            levels = getattr(inner, "level_logits", None)
            if self.has_laws and levels is not None and a < len(levels):
                top = torch.topk(
                    levels[a][0, 0].float(), min(RANKED + 1, levels[a].shape[-1])
                ).indices.tolist()
            else:
                top = context_candidates(ctx + full.tokens[1 : a + 1], RANKED + 1)
            if full.draft_probs is None and a < depth:
                top = [t for t in top if t != full.tokens[a + 1]]
            ranked.append(top[:RANKED])
        return ranked

    def _speculate(self, row: Row, ctx: list[int], full: Draft, stop=None) -> tuple[float, int]:
        """Draft the next cycle for the planned outcomes; each branch forks a copy of the current state."""
        start = time.perf_counter()
        fan = geometric_fanout(self.budget, self.depth, self.estimate.alpha, self.exponent)
        row.base = copy.deepcopy(row.inner.state())
        inner = row.inner
        for a, rank in branch_order(fan, self.estimate.alpha):
            if rank >= len(row.ranked[a]):  # fewer candidates than planned (an impossible length)
                continue
            if stop is not None and stop():
                break
            token = row.ranked[a][rank]
            inner.restore(copy.deepcopy(row.base))
            self._adjust(row)
            inner.commit([list(range(1, a + 1))], None, [row.fetched])
            draft, fetched = draft_one(inner, ctx + full.tokens[1 : a + 1] + [token])
            row.cache[(a, token)] = Branch(draft, inner.state(), fetched)
        spec_s = time.perf_counter() - start
        self.times["spec_s"] += spec_s
        self.times["branches"] += len(row.cache)
        return spec_s, len(row.cache)

    # ---- metrics -----------------------------------------------------------------------------------------
    def _batch_metrics(self) -> dict:
        t, stats = self.times, self.stats
        mean_draft = t["draft_s"] / max(t["drafts"], 1)
        return {
            "fanout_budget": self.budget,
            "hits": sum(stats.hits),
            "lookups": sum(stats.cycles),
            "hit_rate": round(stats.hit_rate, 4),
            "hit_rate_per_position": [
                None if r is None else round(r, 4) for r in stats.hit_rate_per_position
            ],
            "outcomes_per_position": list(stats.cycles),
            "hits_per_position": list(stats.hits),  # raw counts: bench pools batches exactly
            "speculation_s": round(t["spec_s"], 4),
            "branches": t["branches"],
            # in process nothing overlaps: a hit saves a normal draft, the speculation costs its own time
            "draft_latency_hidden_s": round(sum(stats.hits) * mean_draft, 4),
            "target_idle_s": round(t["draft_s"] + t["spec_s"], 4),
            "verify_s": round(t["verify_s"], 4),
        }

    def batch_metrics(self) -> list[dict]:
        """One dict per batch started so far (the current one last)."""
        return self._metrics + ([self._batch_metrics()] if self.rows else [])
