"""Load-aware speculation: pick each cycle's draft depth from measured costs and observed acceptance.

    costs = measure_verify_costs(target, batch_sizes=[1, 4, 16], max_nodes=5)   # once, at start-up
    policy = LoadAwareDepth(costs, max_depth=4)
    generate_speculative(target, drafter, prompts, params, policy=policy)        # --tree auto:4

Why: a verification forward over n tokens per row costs about one token's forward while decoding is
memory-bound (batch 1 on a GPU), but at large batch (or on a CPU) it becomes compute-bound and costs up to
n times more; drafting that is not accepted often enough then makes decoding slower than plain. Serving
engines switch speculation down under load for this reason (vLLM, SGLang; "SmartSpec", Liu et al. 2024).

The rule. For a chain of depth k with conditional acceptance rates a_1..a_k (a_j = P(token j accepted |
token j-1 accepted)), a cycle yields E_k = 1 + sum_j prod_{i<=j} a_i tokens per row (the bonus token
included) and costs T_k = verify(b, k + 1) + k * draft_step, so the policy picks the k in 0..K that
maximizes E_k / T_k; k = 0 is a plain decoding step (E_0 = 1, no draft). verify(b, n) is the measured
cost curve (interpolated over batch sizes); draft_step and a_j are running averages of what the cycles
observed, starting from priors: a_j = 0.5 and draft_step = the drafter's `step_cost` (its parameters
over the target's) x verify(b, 1). While k = 0 wins, a probe cycle at depth 1 refreshes a_1 every
`probe_every` cycles, the interval doubling each time the probe confirms plain decoding, and only if
drafting could pay at all (perfect acceptance at the current cost estimates): a drafter that cannot
(early exit through most of the target) never drafts, and never pays its catch-up over the prompt.

The depth of each cycle depends only on earlier cycles, never on the current cycle's random draws, so
the accept/reject rule stays exactly lossless (a stopping-time argument; tests check greedy identity and
the sampled law with auto depth).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from draftsmith.runtime.errors import BadInputError

POLICY_TREES = {"auto": "load-aware chain depth", "adaptive": "confidence-driven verification budget"}
# adaptive:K,survival=SOURCE: where adaptive verification's estimates come from (runtime/verify/adaptive.py)
SURVIVAL_SOURCES = ("auto", "confidence", "observed")
ADAPTIVE_FORM = f"adaptive:K[,survival={'|'.join(SURVIVAL_SOURCES)}] with an integer K in [1, 16]"


def parse_adaptive(spec: str) -> tuple[int, str]:
    """`adaptive:K[,survival=SOURCE]` -> (K, SOURCE). Anything else after K (a tree shape, another option)
    is refused: confidence-driven verification truncates a chain, per row, to a prefix."""
    arg = spec.partition(":")[2]
    depth, _, option = arg.partition(",")
    key, eq, source = option.partition("=")
    if not depth.isdigit() or not 1 <= int(depth) <= 16 or (option and (key, eq) != ("survival", "=")):
        raise BadInputError(
            "--tree", spec, f"{ADAPTIVE_FORM} (confidence-driven verification budget: it cuts a chain of K "
            "to a per-row prefix; a tree shape such as static:, dynamic: or cartesian: cannot be truncated "
            "that way: give it without adaptive)",
        )  # fmt: skip
    source = source or "auto"
    if source not in SURVIVAL_SOURCES:
        raise BadInputError(
            "--tree", spec, f"survival= one of {', '.join(SURVIVAL_SOURCES)} ({ADAPTIVE_FORM})"
        )
    return int(depth), source


def parse_auto(spec: str) -> int | None:
    """`auto:K` (load-aware) or `adaptive:K` (runtime/verify/adaptive.py) -> K, the deepest chain the policy
    may draft or verify; None for any other tree spec."""
    kind, _, arg = spec.partition(":")
    if kind not in POLICY_TREES:
        return None
    if kind == "adaptive":  # adaptive:K[,survival=SOURCE]
        return parse_adaptive(spec)[0]
    if not arg.isdigit() or not 1 <= int(arg) <= 16:
        raise BadInputError("--tree", spec, f"{kind}:K with an integer K in [1, 16] ({POLICY_TREES[kind]})")
    return int(arg)


@dataclass
class VerifyCosts:
    """Seconds of one target forward over n new tokens per row (n = 1..max), per measured batch size."""

    seconds: dict[int, list[float]]  # batch size -> [cost of n = 1, 2, ...]

    def __call__(self, batch: int, nodes: int) -> float:
        sizes = sorted(self.seconds)
        if nodes > len(self.seconds[sizes[0]]):
            raise ValueError(f"costs measured up to {len(self.seconds[sizes[0]])} nodes, asked {nodes}")
        lo = max((b for b in sizes if b <= batch), default=sizes[0])
        hi = min((b for b in sizes if b >= batch), default=sizes[-1])
        if lo == hi:
            return self.seconds[lo][nodes - 1] * (batch / lo if batch > lo else 1.0)
        w = (batch - lo) / (hi - lo)  # linear in the batch size between two measured sizes
        return (1 - w) * self.seconds[lo][nodes - 1] + w * self.seconds[hi][nodes - 1]

    def ratios(self) -> dict[int, list[float]]:
        """Cost of n nodes over the cost of 1 node, per batch size (the curve the report plots)."""
        return {b: [c / costs[0] for c in costs] for b, costs in self.seconds.items()}


@torch.inference_mode()
def measure_verify_costs(
    target, batch_sizes: list[int], max_nodes: int, context: int = 128, repeats: int = 5
) -> VerifyCosts:
    """Time a forward over n = 1..max_nodes chain tokens per row after a `context`-token prefix (prefilled
    once; the cache is cropped back after each forward), for each batch size; rounds interleave n so drift
    hits all alike; median of `repeats` (one warm-up round)."""
    from draftsmith.runtime.verify.tree import ancestor_mask, chain, position_ids

    seconds: dict[int, list[float]] = {}
    vocab = min(target.vocab_size, 1000)
    for batch in sorted(set(batch_sizes)):
        cache = target.new_cache(batch, context + max_nodes)
        target.forward(torch.randint(0, vocab, (batch, context), device=target.device), cache)
        times: list[list[float]] = [[] for _ in range(max_nodes)]
        for rep in range(repeats + 1):
            for n in range(1, max_nodes + 1):
                ids = torch.randint(0, vocab, (batch, n), device=target.device)
                tree = chain(n - 1)
                mask = None if n == 1 else ancestor_mask(tree).expand(batch, n, n).to(target.device)
                pos = position_ids(tree, context).expand(batch, n).to(target.device)
                _sync(target.device)
                start = time.perf_counter()
                target.logits(target.forward(ids, cache, pos, tree_mask=mask).hidden)
                _sync(target.device)
                cache.crop(context)
                if rep:
                    times[n - 1].append(time.perf_counter() - start)
        seconds[batch] = [statistics.median(t) for t in times]
    return VerifyCosts(seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def expected_tokens(rates: list[float], depth: int) -> float:
    """E_k: tokens per cycle per row for a chain of `depth` with conditional acceptance `rates`."""
    total, survive = 1.0, 1.0
    for a in rates[:depth]:
        survive *= a
        total += survive
    return total


@dataclass
class AcceptanceTally:
    """Conditional acceptance per position, a_j = P(token j accepted | token j-1 was), as decayed counts
    that start from a prior (load-aware depth and adaptive verification keep one each)."""

    positions: int
    prior_accept: float = 0.5  # pseudo-observation before any cycle (weight `prior_weight`)
    prior_weight: float = 2.0
    decay: float = 0.97  # per observed cycle: recent acceptance counts more
    tried: list[float] = field(init=False)
    accepted: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.tried = [self.prior_weight] * self.positions
        self.accepted = [self.prior_weight * self.prior_accept] * self.positions

    def rates(self) -> list[float]:
        return [a / t for a, t in zip(self.accepted, self.tried, strict=True)]

    def add(self, j: int, accepted_lengths: list[int]) -> None:
        """One cycle at position j + 1, over the rows that tried it (their accepted lengths, each >= j)."""
        if accepted_lengths:
            self.tried[j] = self.decay * self.tried[j] + len(accepted_lengths)
            self.accepted[j] = self.decay * self.accepted[j] + sum(n >= j + 1 for n in accepted_lengths)


@dataclass
class LoadAwareDepth:
    costs: VerifyCosts
    max_depth: int
    step_cost: float = 0.0  # prior for one drafted level, relative to a 1-token forward (Drafter.step_cost)
    probe_every: int = 8
    max_probe_every: int = 256
    tally: AcceptanceTally = field(init=False)
    draft_step_s: float | None = field(default=None, init=False)  # seconds per drafted level (EMA)
    depth_counts: list[int] = field(init=False)  # how often each depth was chosen

    def __post_init__(self) -> None:
        self.tally = AcceptanceTally(self.max_depth)
        self.depth_counts = [0] * (self.max_depth + 1)
        self._since_probe, self._interval, self._probing = 0, self.probe_every, False

    def rates(self) -> list[float]:
        return self.tally.rates()

    def cycle_seconds(self, batch: int, depth: int) -> float:
        step = self.draft_step_s if self.draft_step_s is not None else self.step_cost * self.costs(batch, 1)
        return self.costs(batch, depth + 1) + depth * step

    def best_depth(self, batch: int, rates: list[float] | None = None) -> int:
        rates = self.rates() if rates is None else rates
        gains = [expected_tokens(rates, k) / self.cycle_seconds(batch, k) for k in range(self.max_depth + 1)]
        return max(range(len(gains)), key=gains.__getitem__)

    def could_pay(self, batch: int) -> bool:
        """Would drafting beat plain decoding if every drafted token were accepted?"""
        return self.best_depth(batch, [1.0] * self.max_depth) > 0

    def choose(self, batch: int) -> int:
        """The depth of the next cycle for a batch of `batch` running rows."""
        depth = self.best_depth(batch)
        self._probing = False
        if depth == 0:
            self._since_probe += 1
            if self._since_probe >= self._interval and self.could_pay(batch):
                depth, self._probing, self._since_probe = 1, True, 0
        else:
            self._since_probe, self._interval = 0, self.probe_every
        self.depth_counts[depth] += 1
        return depth

    def budget(self, drafts, batch: int):
        """The drafts as they are: the depth was chosen before drafting (adaptive verification cuts here)."""
        return drafts

    @property
    def probing(self) -> bool:
        """Whether the depth last chosen is a probe (depth 1 where plain decoding was the best guess)."""
        return self._probing

    def observe(
        self,
        batch: int,
        depth: int,
        accepted_lengths: list[int],
        draft_s: float,
        rows=None,
        kept=None,
        catch_up: bool = False,
    ) -> None:
        """After a cycle at `depth`: each running row's accepted length and the drafter's wall time (`rows`,
        the running rows' places in the batch, matter to adaptive verification only; `kept`, the nodes
        each running row verified where adaptive verification cut the chain: default all `depth`).
        `catch_up`: the drafter first caught up over tokens it had not seen (the prompt, or the plain
        steps before), so its time is not a drafted level's: a probe after 200 plain steps timed as the
        cost of one level would keep the policy from ever drafting again."""
        if depth == 0:
            return
        if not catch_up:
            step = draft_s / depth
            self.draft_step_s = step if self.draft_step_s is None else 0.8 * self.draft_step_s + 0.2 * step
        kept = [depth] * len(accepted_lengths) if kept is None else kept
        for j in range(
            depth
        ):  # conditional counts: position j+1 was tried iff kept and positions <= j accepted
            self.tally.add(j, [n for n, k in zip(accepted_lengths, kept, strict=True) if k > j and n >= j])
        if self._probing and self.best_depth(batch) == 0:  # plain decoding confirmed: probe less often
            self._interval = min(2 * self._interval, self.max_probe_every)
