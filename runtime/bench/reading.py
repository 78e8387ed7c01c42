"""What a demo's bench rows say in a few sentences: a pure function of the rows (`draftsmith demo`).

    blocks = [Block("fp32", rows, verify_ms), Block("int4-g64", int4_rows, int4_verify_ms)]
    for sentence in reading(blocks):
        print(sentence)

A block is one target's rows from one bench block (batch 1, one temperature), every speedup over that
block's own `plain` row, plus the target's verify-cost curve: the ms of one forward over n = 1, 2, ...
tokens after a prefix (runtime/verify/load_aware.py `measure_verify_costs`, what `auto:K` measures at
start-up). The first block is the demo's target; later ones are the same target made cheaper to verify
(weight-only quantization), each against its own plain decoding.

The arithmetic the sentences quote: a speculative cycle costs draft + verify ms, i.e. (draft + verify) /
TPOT plain steps, and commits tau tokens (new tokens per target forward), so its speedup is about
tau / steps. A drafter accepted in full on a tree of n tokens gains at most n / (verify(n) / verify(1)):
that ceiling is why the shape of the curve (compute-bound: k tokens cost about k steps; memory-bound:
about one step) decides how much there is to win.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.runtime.bench.report import plot_labels
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.tree import parse_tree_spec

COMPUTE_BOUND = 0.5  # an extra verified token costing >= half a plain step: compute-bound
MEMORY_BOUND = 0.2  # <= a fifth of a plain step: memory-bound (verification nearly free)
CONTENDED = 1.5  # a row's verify ms per cycle over the same forward timed alone: something else ran too
PUBLISHED = (
    "Where the same kind of head pays (published results, not measured here): on a GPU at batch 1 a "
    "decoding step is memory-bound, it reads every weight to emit one token, so a forward over a few more "
    "tokens costs about one step, and a tree of n tokens can gain up to n-fold. There EAGLE-3 heads reach "
    "tau 6.23 and 4.44x plain decoding on LLaMA-3.1-8B and tau 5.88 and 4.12x on LLaMA-3.3-70B "
    "(temperature 0, RTX 3090 and A100; Li et al. 2025, arXiv:2503.01840, Table 1), and SGLang with "
    "EAGLE-3 2.36x on one H100 (LLaMA-3.1-8B, ibid. Table 4). Those are 8B-70B targets; a target decodes "
    "memory-bound on a GPU once reading its weights dominates a step, from about 1-2B parameters up."
)


@dataclass
class Block:
    """One target's bench rows and its verify-cost curve (speedups over this block's own plain row)."""

    label: str  # the target's weights: fp32, int4-g64, ...
    rows: list[dict]  # bench rows (runtime/bench/compare.py summarize) at one temperature and batch size
    verify_ms: list[float]  # ms of one target forward over n = 1, 2, ... tokens (batch 1)


def verified_tokens(method: str) -> int | None:
    """Tokens one verification forward checks for a DRAFT@TREE method (root included; auto:K: at most
    K + 1); None for a method without a tree."""
    tree = method.partition("@")[2].partition("+")[0]
    if tree.startswith("auto:") and tree[5:].isdigit():
        return int(tree[5:]) + 1
    try:
        return parse_tree_spec(tree).size if tree else None
    except BadInputError:
        return None


def drafter_rows(block: Block) -> list[dict]:
    return [r for r in block.rows if r.get("tree") and r.get("mean_accepted") is not None]


def plain_row(block: Block) -> dict | None:
    return next((r for r in block.rows if r["method"] == "plain"), None)


def cycle_steps(row: dict, plain: dict | None) -> float | None:
    """A cycle's draft + verify ms in plain decoding steps (plain's median TPOT); None when unmeasured."""
    step = plain and plain["tpot_ms"]["median"]
    draft, verify = row.get("draft_ms_per_cycle"), row.get("verify_ms_per_cycle")
    return None if not step or draft is None or verify is None else (draft + verify) / step


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def tau_sentence(block: Block, drafters: list[dict], names: dict[str, str]) -> str:
    taus = _join([f"{r['mean_accepted']:.2f} for {names[r['method']]}" for r in drafters])
    return (
        "tau, the mean accepted length (new tokens per target forward; plain decoding's is 1.00), is "
        f"{taus}: each verification commits that many tokens on average where a plain step commits one."
    )


def curve_sentence(block: Block, drafters: list[dict]) -> str:
    """The curve at the rows' tree sizes, the ceiling each tree allows, and compute- or memory-bound."""
    ms = block.verify_ms
    sizes = sorted({n for r in drafters if (n := verified_tokens(r["method"])) and 1 < n <= len(ms)})
    sizes = sizes or [len(ms)]
    points = _join([f"{n} tokens {ms[n - 1]:.1f} ms ({ms[n - 1] / ms[0]:.2f}x)" for n in sizes if n > 1])
    text = (
        f"The verify-cost curve of the {block.label} target (one forward over n tokens, batch 1, this run): "
    )
    text += f"1 token {ms[0]:.1f} ms" + (f", {points}" if points else "") + "."
    if sizes[-1] > 1:
        ceilings = _join(
            [f"{n} / {ms[n - 1] / ms[0]:.2f} = {n * ms[0] / ms[n - 1]:.1f}x on {n} tokens" for n in sizes]
        )
        text += f" So even a drafter accepted in full gains at most {ceilings}, before its drafting."
        # a plain step's share each extra token costs, at the dearest of the rows' tree sizes (on a CPU
        # the curve is not monotonic: 2-3 rows may take a per-row path, 4 and more one GEMM)
        extra = max((ms[n - 1] / ms[0] - 1) / (n - 1) for n in sizes if n > 1)
        if extra >= COMPUTE_BOUND:
            text += (
                f" Each extra token costs {extra:.0%} of a plain step: the forward is compute-bound here "
                "(its arithmetic, not reading the weights, sets its time), so verifying k tokens costs "
                "nearly k plain steps and leaves little to win."
            )
        elif extra <= MEMORY_BOUND:
            text += (
                f" Each extra token costs only {extra:.0%} of a plain step: verification is nearly free "
                "(memory-bound: reading the weights, not the arithmetic, sets a forward's time)."
            )
        else:
            text += (
                f" Each extra token costs {extra:.0%} of a plain step, between memory-bound (about 0%: "
                "verification free) and compute-bound (100%: k tokens cost k steps)."
            )
    return text


def contention_sentence(block: Block, drafters: list[dict], names: dict[str, str]) -> str | None:
    """When the rows' verification took much longer than the same forward timed alone (the curve): the
    worst such row, and what it means for the speedups; None when they agree."""
    ms = block.verify_ms
    measured = [(r, n) for r in drafters if (n := verified_tokens(r["method"])) and n <= len(ms)]
    ratios = [
        (r["verify_ms_per_cycle"] / ms[n - 1], r, n) for r, n in measured if r.get("verify_ms_per_cycle")
    ]
    if not ratios or max(t[0] for t in ratios) < CONTENDED:
        return None
    ratio, r, n = max(ratios, key=lambda t: t[0])
    return (
        f"In these rows a verification took up to {ratio:.1f}x the same forward timed alone "
        f"({names[r['method']]}: {r['verify_ms_per_cycle']:.1f} ms per cycle against {ms[n - 1]:.1f} ms for "
        f"{n} tokens), most likely other work sharing the cores while the rows ran: rerun on a quiet machine "
        "before taking these speedups as this machine's."
    )


def cost_clause(row: dict, plain: dict | None, name: str) -> str:
    """`NAME: tau T for S plain steps (draft D + verify V ms against a step of P ms)`."""
    steps = cycle_steps(row, plain)
    if steps is None:
        return f"{name} {row['speedup_vs_plain']:.2f}x (tau {row['mean_accepted']:.2f})"
    return (
        f"{name} {row['speedup_vs_plain']:.2f}x: its cycle (draft {row['draft_ms_per_cycle']:.1f} + verify "
        f"{row['verify_ms_per_cycle']:.1f} ms) costs {steps:.2f} plain steps of "
        f"{plain['tpot_ms']['median']:.1f} ms and commits tau {row['mean_accepted']:.2f} tokens"
    )


def losing_sentence(block: Block, losing: list[dict], names: dict[str, str]) -> str:
    plain = plain_row(block)
    who = (
        "Every drafter"
        if len(losing) == len(drafter_rows(block))
        else _join([names[r["method"]] for r in losing])
    )
    clauses = "; ".join(cost_clause(r, plain, names[r["method"]]) for r in losing)
    return (
        f"{who} ran slower than plain decoding on the {block.label} target, because a cycle pays only when "
        f"its tau exceeds its cost in plain steps (speedup about tau / steps): {clauses}."
    )


def winning_sentence(block: Block, winning: list[dict], names: dict[str, str]) -> str:
    plain = plain_row(block)
    clauses = "; ".join(cost_clause(r, plain, names[r["method"]]) for r in winning)
    return f"Faster than plain decoding on the {block.label} target: {clauses}."


def cheap_sentence(main: Block, block: Block, names: dict[str, str]) -> str:
    """A second target (the first made cheaper to verify), against its own plain decoding."""
    plain, main_plain = plain_row(block), plain_row(main)
    drafters = drafter_rows(block)
    if plain is None or not drafters:
        return f"The {block.label} target has no drafter rows to read."
    rate = f"{plain['tokens_per_s']:.1f} tok/s"
    if main_plain:
        rate += f", {plain['tokens_per_s'] / main_plain['tokens_per_s']:.2f}x the {main.label} target's"
    text = (
        f"The same prompts on the target quantized to {block.label} (weight-only; another model, so its "
        f"rows compare with its own plain decoding, {rate})"
    )
    ms = block.verify_ms
    sizes = sorted({n for r in drafters if (n := verified_tokens(r["method"])) and 1 < n <= len(ms)})
    if sizes:
        n = sizes[0]
        text += f": verifying {n} tokens costs {ms[n - 1] / ms[0]:.2f}x one token's forward"
    best = max(drafters, key=lambda r: r["speedup_vs_plain"])
    text += f"; {cost_clause(best, plain, names[best['method']])}"
    if best["speedup_vs_plain"] > 1:
        return text + ". Here drafting pays: verification and drafting are cheap next to a step."
    return text + ". It did not beat its plain decoding in this run."


def reading(blocks: list[Block]) -> list[str]:
    """The sentences: tau; the verify-cost curve; why drafters lost (only when one did) or won; the
    cheaper-to-verify blocks; after each block, a warning when its rows' verification took much longer than
    its curve (a busy machine); where published results say the head pays."""
    main = blocks[0]
    names = plot_labels(r["method"] for b in blocks for r in b.rows)
    drafters = drafter_rows(main)
    out = [tau_sentence(main, drafters, names)] if drafters else []
    if main.verify_ms:
        out.append(curve_sentence(main, drafters))
    losing = [r for r in drafters if r["speedup_vs_plain"] < 1]
    winning = [r for r in drafters if r["speedup_vs_plain"] >= 1]
    if losing:
        out.append(losing_sentence(main, losing, names))
    if winning:
        out.append(winning_sentence(main, winning, names))
    for block in blocks:
        if block is not main:
            out.append(cheap_sentence(main, block, names))
        if block.verify_ms and (busy := contention_sentence(block, drafter_rows(block), names)):
            out.append(busy)
    return [*out, PUBLISHED]


def side_by_side(blocks: list[Block]) -> str:
    """Markdown: every block's rows in one table, each speedup over its own target's plain decoding."""
    names = plot_labels(r["method"] for b in blocks for r in b.rows)
    lines = [
        "| target | method | tok/s | speedup over its target's plain | tau | draft + verify ms per cycle |",
        "|---|---|---:|---:|---:|---|",
    ]
    for block in blocks:
        for r in block.rows:
            tau = "-" if r.get("mean_accepted") is None else f"{r['mean_accepted']:.2f}"
            cycle = "-"
            if r.get("verify_ms_per_cycle") is not None:
                cycle = f"{r['draft_ms_per_cycle']:.1f} + {r['verify_ms_per_cycle']:.1f}"
            lines.append(
                f"| {block.label} | {names[r['method']]} | {r['tokens_per_s']:.1f} "
                f"| {r['speedup_vs_plain']:.2f} | {tau} | {cycle} |"
            )
    return "\n".join(lines)


def curve_table(blocks: list[Block]) -> str:
    """Markdown: each block's verify-cost curve in ms and over one token's forward."""
    width = max(len(b.verify_ms) for b in blocks)
    lines = ["| n tokens verified | " + " | ".join(str(n) for n in range(1, width + 1)) + " |"]
    lines.append("|---|" + "---:|" * width)
    for b in blocks:
        if b.verify_ms:
            lines.append(f"| {b.label}, ms | " + " | ".join(f"{v:.1f}" for v in b.verify_ms) + " |")
            lines.append(
                f"| {b.label}, / n = 1 | "
                + " | ".join(f"{v / b.verify_ms[0]:.2f}" for v in b.verify_ms)
                + " |"
            )
    return "\n".join(lines)
