"""SSD projection for a 70B target on H100s: the replay simulator (runtime/bench/ssd_replay.py) fed with
synthetic cycles from a published acceptance profile and the cost model next to it (ssd_costs.py). A study:
it lives outside the installed package and imports its sibling by name (run it as a script).

    python scripts/studies/ssd_projection.py [--tp 4 8] [--fanout 8 16 32] [--depth 7] [--json]

prints a markdown table labeled "projection": plain decoding, the synchronous chain (drafter on the
target's tensor-parallel ranks, or on its own GPU) and SSD (drafter on its own GPU, pre-drafting the next
cycle during verification) for an EAGLE-3 head and a Llama-3.2-1B draft model. Nothing here was measured on
an H100; every input is a cited number or a stated assumption (ssd_costs.py for the costs).

Acceptance (greedy, T = 0: acceptance = the drafter's top-1 agreeing with the target):
- EAGLE-3: 0.77 at every position. The EAGLE-3 paper (arXiv 2503.01840, Fig. 7, LLaMA-3.1-8B, MT-bench,
  chain draft) shows n-alpha between ~0.76 and ~0.79 for n = 0..7 (read off the plot); it gives no
  per-position curve for 70B, so the same flat profile is assumed there. A 7-chain then averages
  (1 - 0.77^8) / 0.23 = 3.81 tokens per cycle, between vLLM's re-measured chains for 70B heads (2.88-3.62
  RedHat speculator, 3.89-5.08 Nebius LK-loss head, K = 7; the Nebius model card) and below the paper's
  tree (5.88 mean, Table 1), as a chain should be.
- Llama-3.2-1B drafting for the 70B: 0.70 at every position, an assumption (no per-position figure found
  for this pair; a separate LM drafter sees its own real tokens, so its agreement does not decay with depth
  the way EAGLE-1's did).
SSD hits: the token the target adds after a accepted tokens has a rank among the drafter's candidates. Its
law (an assumption): at a full accept (the bonus token) P(rank >= F) = (1 - alpha) F^-r for F >= 1, so
P(rank 0) = alpha; after a rejection the rejected token is left out and P(rank >= F) = (F + 1)^-r. r = 1 is
the miss power law the runtime's planner assumes (runtime/verify/ssd_fanout.py, DEFAULT_EXPONENT =
1 / (1 + r)); the SSD paper (arXiv 2603.03251) fits such a power law. Ranks past 32 are "not ranked" (-1),
as in the runtime's traces. The replay then decides hits with the runtime's own planner.

Placement and timing: the target runs at TP = 4 or 8; SSD's drafter has its own H100 at TP = 1 (the SSD
repository's async mode: 70B on 4 GPUs plus the draft on a fifth); a sync drafter runs on the target's
ranks (what vLLM V1 does with an EAGLE head) or on its own GPU. A pre-speculation of B branches is K
batched drafter forwards at batch B (the first one reads each branch's hypothesized prefix); each branch
reads the context's KV cache on its own (no prefix sharing in the kernel: conservative). Limits: SSD's
EAGLE-3 rows assume a pre-drafted branch accepts as often as a normal draft, which is optimistic (a branch
lacks the target's features of the tokens it assumes accepted; this runtime refuses SSD for feature heads);
Saguaro sampling, prefill and the p2p latency of a sync drafter on its own GPU are left out.

Reading the table: SSD hides the draft chain behind verification, so it gains in proportion to the chain's
share of a cycle in the best synchronous placement. The 70B's EAGLE-3 head is not small (1.40B parameters: an
8192-wide layer and a 32000-row LM head, ~2.4 GB a forward, like the 1B model's 2.5 GB), but it is one layer:
sharded on the target's ranks it pays 2 all-reduces a forward and its 7-chain is ~14-16% of a verification,
while SSD must run it on its own GPU at TP = 1. The 1B has 16 layers (32 all-reduces a forward when sharded),
so its 7-chain is 1/3 of a verification or more wherever it runs, and that is what SSD hides. A budget must be
>= K + 1 (one candidate per accepted length): fan-out 4 needs `--depth 3`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass

from ssd_costs import (
    BF16,
    EAGLE3_70B,
    EAGLE3_70B_FC,
    H100_SXM,
    LLAMA_32_1B,
    LLAMA_33_70B,
    Gpu,
    Model,
    step_s,
)

from draftsmith.runtime.bench.ssd_replay import CostModel, Cycle, simulate
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.ssd_fanout import check_budget

RANKED = 32  # candidates a trace ranks per position (runtime/drafters/ssd.py RANKED)
MISS_POWER = 1.0  # r in P(miss | F candidates) ~ F^-r, the planner's default
EAGLE3_ALPHA = 0.77  # EAGLE-3 paper Fig. 7 (8B chain), assumed for 70B
LM_1B_ALPHA = 0.70  # assumption
CONTEXT = 1024  # mean context during decoding (assumption: prompt + generated)


@dataclass(frozen=True)
class Drafter:
    name: str
    model: Model | None  # None: a drafter that costs nothing (the control: SSD cannot beat sync)
    alpha: float  # per-position acceptance (flat profile)
    fc_params: int = 0  # read once per chain (EAGLE-3's feature fusion)


EAGLE3 = Drafter("EAGLE-3 head", EAGLE3_70B, EAGLE3_ALPHA, EAGLE3_70B_FC)
LM_1B = Drafter("Llama-3.2-1B", LLAMA_32_1B, LM_1B_ALPHA)


def rank_tail(f: int, alpha: float, bonus: bool, r: float = MISS_POWER) -> float:
    """P(rank >= f) of the token the target adds (see the module docstring)."""
    if f <= 0:
        return 1.0
    return (1 - alpha) * f**-r if bonus else (f + 1) ** -r


def sample_rank(u: float, alpha: float, bonus: bool, r: float = MISS_POWER) -> int:
    """Inverse CDF: the rank is the number of f in 1..RANKED with u < P(rank >= f); -1 past RANKED - 1."""
    rank = 0
    while rank < RANKED and u < rank_tail(rank + 1, alpha, bonus, r):
        rank += 1
    return -1 if rank >= RANKED else rank


def synthetic_cycles(alpha: float, depth: int, n: int, seed: int = 0, r: float = MISS_POWER) -> list[Cycle]:
    """n cycles of a K-chain with i.i.d. per-position acceptance alpha and the rank law above."""
    rng = random.Random(seed)
    cycles = []
    for _ in range(n):
        a = 0
        while a < depth and rng.random() < alpha:
            a += 1
        cycles.append(Cycle(a, depth, sample_rank(rng.random(), alpha, a == depth, r)))
    return cycles


def draft_chain_s(d: Drafter, gpu: Gpu, depth: int, tp: int = 1, batch: int = 1, ctx: int = CONTEXT) -> float:
    """K drafter forwards (the first reads the accepted tokens: up to K + 1 per row) + the fc once."""
    if d.model is None:
        return 0.0
    first = step_s(d.model, gpu, tp, depth + 1, ctx, batch, draft=True)
    rest = (depth - 1) * step_s(d.model, gpu, tp, 1, ctx, batch, draft=True)
    return first + rest + d.fc_params * BF16 / tp / gpu.hbm_sustained_s


@dataclass
class Row:
    method: str
    placement: str
    depth: int | None
    budget: int | None
    draft_step_ms: float | None
    draft_chain_ms: float | None
    verify_ms: float
    tokens_per_cycle: float
    hit_rate: float | None
    tokens_s: float
    vs_plain: float
    vs_sync: float | None


def drafter_rows(
    d: Drafter, gpu: Gpu, tp: int, depth: int, budgets: list[int], cycles: list[Cycle], plain_s: float
) -> list[Row]:
    """Sync (drafter on the target's ranks, and on its own GPU) and SSD at each budget for one drafter."""
    verify = step_s(LLAMA_33_70B, gpu, tp, depth + 1, CONTEXT)
    per_cycle = sum(c.accepted + 1 for c in cycles) / len(cycles)
    step = (lambda t: step_s(d.model, gpu, t, 1, CONTEXT, draft=True)) if d.model else (lambda t: 0.0)
    rows, best_sync = [], 0.0
    for where, draft_tp in (("target's TP ranks", tp), ("own GPU, TP=1", 1)):
        cost = CostModel(draft_chain_s(d, gpu, depth, draft_tp), verify, 0.0)
        pred = simulate(cycles, depth + 1, cost)
        best_sync = max(best_sync, pred.sync_tokens_per_s)
        rows.append(
            Row(f"sync {d.name} chain", where, depth, None, step(draft_tp) * 1e3, cost.draft_s * 1e3,
                verify * 1e3, per_cycle, None, pred.sync_tokens_per_s, pred.sync_tokens_per_s * plain_s, 1.0)
        )  # fmt: skip
    for budget in budgets:
        check_budget(budget, depth, "--fanout")
        spec = draft_chain_s(d, gpu, depth, 1, batch=budget)  # B branches drafted as one batch
        cost = CostModel(draft_chain_s(d, gpu, depth, 1), verify, 0.0, spec, gpu.p2p_latency_s)
        pred = simulate(cycles, budget, cost)
        rows.append(
            Row(f"SSD {d.name} fan-out {budget}", "own GPU, TP=1", depth, budget, step(1) * 1e3,
                cost.draft_s * 1e3, verify * 1e3, per_cycle, pred.hit_rate, pred.ssd_tokens_per_s,
                pred.ssd_tokens_per_s * plain_s, pred.ssd_tokens_per_s / best_sync)
        )  # fmt: skip
    for row in rows[:2]:
        row.vs_sync = row.tokens_s / best_sync
    return rows


def project(
    tps: list[int], budgets: list[int], depth: int = 7, n: int = 4000, seed: int = 0, gpu: Gpu = H100_SXM,
    drafters: tuple[Drafter, ...] = (EAGLE3, LM_1B),
) -> dict[int, list[Row]]:  # fmt: skip
    """{tp: rows}: plain, then each drafter's sync and SSD rows."""
    cycles = {d.name: synthetic_cycles(d.alpha, depth, n, seed) for d in drafters}
    out = {}
    for tp in tps:
        plain_s = step_s(LLAMA_33_70B, gpu, tp, 1, CONTEXT)
        rows = [Row("plain (no speculation)", "-", None, None, None, None, plain_s * 1e3, 1.0, None,
                    1 / plain_s, 1.0, None)]  # fmt: skip
        for d in drafters:
            rows += drafter_rows(d, gpu, tp, depth, budgets, cycles[d.name], plain_s)
        out[tp] = rows
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(tp: int, rows: list[Row], gpu: Gpu = H100_SXM) -> str:
    head = (
        f"**Projection** (not a measurement): Llama-3.3-70B bf16 on {tp}x {gpu.name}, batch 1, greedy, "
        f"context {CONTEXT}; SSD drafter on one more {gpu.name}.\n\n"
        "| method | drafter on | K | B | draft fwd ms | draft chain ms | verify ms | tokens/cycle "
        "| hit rate | tok/s | vs plain | vs best sync |\n|" + "---|" * 12
    )
    lines = [head]
    for r in rows:
        cells = [r.method, r.placement, _fmt(r.depth, "d"), _fmt(r.budget, "d")]
        cells += [_fmt(r.draft_step_ms, ".3f"), _fmt(r.draft_chain_ms, ".2f"), f"{r.verify_ms:.2f}"]
        cells += [f"{r.tokens_per_cycle:.2f}", _fmt(r.hit_rate, ".2f"), f"{r.tokens_s:.1f}"]
        cells += [f"{r.vs_plain:.2f}x", _fmt(r.vs_sync, ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit code 2 on bad input (BadInputError), with the reason on stderr."""
    try:
        run(argv)
    except BadInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, nargs="+", default=[4, 8], help="the target's tensor-parallel sizes")
    p.add_argument("--fanout", type=int, nargs="+", default=[8, 16, 32], help="SSD budgets (>= K + 1)")
    p.add_argument("--depth", type=int, default=7, help="chain length K")
    p.add_argument("--cycles", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON row per line instead of markdown")
    args = p.parse_args(argv)
    if args.depth < 1:
        raise BadInputError("--depth", args.depth, "an integer >= 1")
    if args.cycles < 2:
        raise BadInputError("--cycles", args.cycles, "an integer >= 2")
    for tp in args.tp:
        if tp not in (2, 4, 8):  # 139 GB of bf16 weights: not on one 80 GB GPU; 8 = one NVLink node
            raise BadInputError("--tp", tp, "2, 4 or 8")
    tables = project(args.tp, args.fanout, args.depth, args.cycles, args.seed)
    for tp, rows in tables.items():
        if args.json:
            for r in rows:
                print(json.dumps({"projection": True, "tp": tp} | r.__dict__))
        else:
            print(markdown(tp, rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())
