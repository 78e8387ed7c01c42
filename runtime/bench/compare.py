"""`draftsmith bench`: methods side by side on a prompt set, per temperature and batch size.

    rows, meta = run_bench(BenchRequest(drafts=["ngram", "eagle3:runs/head/final"], batch_sizes=[1, 4]))

Fairness (BENCHMARKS.md rules; EAGLE's speed.py and Spec-Bench do the same): every method decodes the same
prompts with the same max-new-tokens; each method first runs one warm-up batch at the batch size it is
about to be timed at; prompts are grouped into batches in source order and, per batch and repeat, the
methods run in a rotating order (A B C, B C A, ...) so drift and order effects hit all alike; with
repeats, each batch's wall time is the median. Multi-turn questions (MT-bench, Spec-Bench) ask turn k
after the method's own answer to turn k-1 (at temperature 0 every lossless method gives the same answer,
so the same second prompt).

Per row (method, temperature, batch size): tokens/s and speedup over `plain` (summed tokens / summed wall
time), the median per-batch speedup, TTFT and TPOT per request (median and p90), tau = new tokens / target
forwards, acceptance per draft position, the distribution of accepted lengths, efficiency = speedup / tau,
draft and verify ms per cycle and the share of wall time drafting (runtime/bench/cycle_fields.py), the
survival estimates' calibration where the drafts carry them (runtime/bench/calibration_report.py),
and at temperature 0 `greedy_identical`: every request's tokens equal plain decoding's, with the first
mismatches listed (never averaged away), each judged by runtime/verify/near_tie.py's rule (bf16 and GPU
numerics may flip a tie of the target's logits; a wrong token is never a near-tie). Rows are reported
by `bench_report.py`.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from draftsmith.runtime.bench.calibration_report import calibration_fields
from draftsmith.runtime.bench.cycle_fields import cycle_fields
from draftsmith.runtime.bench.prompt_sets import BenchPrompt
from draftsmith.runtime.bench.types import BatchOutput, SpecCounters
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")
WARMUP_TOKENS = 8


@dataclass
class GroupRun:
    """One method on one batch of conversations: per turn, the batch's output and its requests."""

    wall_s: float  # all turns; the median over repeats
    turns: list[tuple[list[int], BatchOutput]] = field(default_factory=list)  # (conversation ids, output)
    prompts: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (turn, conversation) -> ids


def encode_turn(target, conv: BenchPrompt, answers: list[str], turn: int, chat: bool) -> list[int]:
    """Prompt ids of `turn`: the earlier turns with the method's own answers, then the new user turn."""
    if not chat:
        return target.encode(conv.turns[turn], chat=False)
    messages = []
    for k in range(turn):
        messages += [{"role": "user", "content": conv.turns[k]}, {"role": "assistant", "content": answers[k]}]
    return target.encode_chat([*messages, {"role": "user", "content": conv.turns[turn]}])


def run_group(method, target, convs: list[BenchPrompt], params, max_new: int, seed: int, chat: bool):
    """Every turn of a batch of conversations -> GroupRun (wall time of this single run)."""
    answers: list[list[str]] = [[] for _ in convs]
    run = GroupRun(0.0)
    for turn in range(max(len(c.turns) for c in convs)):
        ids = [i for i, c in enumerate(convs) if len(c.turns) > turn]
        prompts = [encode_turn(target, convs[i], answers[i], turn, chat) for i in ids]
        out = method.run(prompts, params, max_new, seed + 7919 * turn)
        run.wall_s += out.wall_s
        run.turns.append((ids, out))
        run.prompts.update({(turn, i): prompt for i, prompt in zip(ids, prompts, strict=True)})
        for i, tokens in zip(ids, out.token_ids, strict=True):
            answers[i].append(target.decode(tokens))
    return run


def merge_repeats(runs: list[GroupRun]) -> GroupRun:
    """Repeats of one method on one batch -> the first run's outputs with the median wall time and the
    per-request median TTFT."""
    first = runs[0]
    first.wall_s = statistics.median(r.wall_s for r in runs)
    for t, (_, out) in enumerate(first.turns):
        for j in range(len(out.ttft_s)):
            values = [r.turns[t][1].ttft_s[j] for r in runs if r.turns[t][1].ttft_s[j] is not None]
            out.ttft_s[j] = statistics.median(values) if values else None
    return first


def compare_at(methods: dict, target, convs, params, max_new, batch, repeats, seed, chat) -> dict:
    """All methods on all batches of `batch` conversations, interleaved -> {name: [GroupRun]}. Repeat r
    of batch g runs the methods in the order rotated by g + r, so no method always runs first or last."""
    groups = [convs[i : i + batch] for i in range(0, len(convs), batch)]
    names = list(methods)
    shortest = min(convs, key=lambda c: len(c.turns[0]))
    warm = [BenchPrompt(shortest.turns[:1])] * min(batch, len(convs))
    for name in names:
        run_group(methods[name], target, warm, params, WARMUP_TOKENS, seed, chat)
    runs: dict[tuple[str, int], list[GroupRun]] = {(n, g): [] for n in names for g in range(len(groups))}
    desc = f"bench T={params.temperature:g} batch={batch}"
    with tqdm(total=repeats * len(groups) * len(names), desc=desc, unit="run", leave=False) as bar:
        for rep in range(repeats):
            for g, group in enumerate(groups):
                shift = (g + rep) % len(names)
                for name in names[shift:] + names[:shift]:
                    group_seed = seed + 1009 * g
                    runs[name, g].append(
                        run_group(methods[name], target, group, params, max_new, group_seed, chat)
                    )
                    bar.update(1)
    return {name: [merge_repeats(runs[name, g]) for g in range(len(groups))] for name in names}


def requests(runs: list[GroupRun]) -> list[tuple[tuple[int, int, int], list[int], float, float | None]]:
    """(group, turn, conversation) -> new tokens, latency (its batch's wall time), TTFT."""
    out = []
    for g, run in enumerate(runs):
        for t, (ids, batch) in enumerate(run.turns):
            for j, i in enumerate(ids):
                out.append(((g, t, i), batch.token_ids[j], batch.wall_s, batch.ttft_s[j]))
    return out


def quantiles(values: list[float]) -> dict:
    if not values:
        return {"median": None, "p90": None}
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
    }


def summarize(
    name: str, runs: list[GroupRun], plain: list[GroupRun], params, batch: int, convs, target=None
) -> dict:
    reqs, plain_reqs = requests(runs), requests(plain)
    tokens = sum(len(r[1]) for r in reqs)
    wall = sum(r.wall_s for r in runs)
    plain_rate = sum(len(r[1]) for r in plain_reqs) / sum(r.wall_s for r in plain)
    rate = tokens / wall
    ttft = [r[3] for r in reqs if r[3] is not None]
    tpot = [(r[2] - r[3]) / (len(r[1]) - 1) for r in reqs if r[3] is not None and len(r[1]) > 1]
    row = {
        "method": name,
        "draft": name.partition("@")[0] if "@" in name else None,
        "tree": name.partition("@")[2] or None,
        "temperature": params.temperature,
        "batch_size": batch,
        "num_prompts": len(convs),
        "requests": len(reqs),
        "new_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(rate, 3),
        "speedup_vs_plain": round(rate / plain_rate, 4),
        "median_batch_speedup": round(
            statistics.median(
                (sum(map(len, _tokens(r))) / r.wall_s) / (sum(map(len, _tokens(p))) / p.wall_s)
                for r, p in zip(runs, plain, strict=True)
            ),
            4,
        ),
        "ttft_ms": {k: _ms(v) for k, v in quantiles(ttft).items()},
        "tpot_ms": {k: _ms(v) for k, v in quantiles(tpot).items()},
        "latency_s": {
            k: None if v is None else round(v, 4) for k, v in quantiles([r[2] for r in reqs]).items()
        },
    }
    row.update(spec_fields(runs, tokens, row["speedup_vs_plain"]))
    row.update(cycle_fields([out for r in runs for _, out in r.turns]))  # draft / verify ms per cycle, SSD
    row.update(calibration_fields([out for r in runs for _, out in r.turns]))  # survival estimates' ECE
    if params.greedy:
        row.update(greedy_fields(reqs, plain_reqs, runs, target))
    return row


def _tokens(run: GroupRun) -> list[list[int]]:
    return [t for _, out in run.turns for t in out.token_ids]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def spec_fields(runs: list[GroupRun], tokens: int, speedup: float) -> dict:
    outs = [out for r in runs for _, out in r.turns]
    forwards = [o.target_forwards for o in outs]
    fields: dict = {"mean_accepted": None, "accept_rate_per_position": None, "efficiency": None}
    if all(f is not None for f in forwards):
        tau = tokens / sum(forwards)
        fields.update(mean_accepted=round(tau, 4), efficiency=round(speedup / tau, 4))
    if any(o.spec is not None for o in outs):
        pooled = SpecCounters()
        for o in outs:
            if o.spec is not None:
                pooled.add(o.spec)
        fields["accept_rate_per_position"] = [round(r, 4) for r in pooled.accept_rates()]
        fields["accepted_length_counts"] = pooled.accepted_length_counts
        fields["cycles"] = pooled.cycles
    return fields


def greedy_fields(reqs, plain_reqs, runs: list[GroupRun], target=None) -> dict:
    """Temperature 0: `greedy_identical` (every request's tokens equal plain decoding's) and, when some
    differ, each first mismatch judged by the near-tie rule (runtime/verify/near_tie.py: the target's logit
    gap
    between the two tokens there, needs `target`). A later turn whose prompt already differs (it follows
    the method's own earlier answer) takes its conversation's earlier verdict. `greedy_near_ties_only`:
    every difference is a near-tie, as bf16 or GPU numerics give; never true of a wrong token."""
    from draftsmith.runtime.verify.near_tie import first_difference, first_mismatch

    reference = {key: tokens for key, tokens, _, _ in plain_reqs}
    mismatches, verdicts = [], {}  # verdicts: (group, conversation) -> near-tie of its first mismatch
    for key, tokens, _, _ in sorted(reqs, key=lambda r: r[0][1]):  # turn order: earlier verdicts first
        ref = reference[key]
        if tokens == ref:
            continue
        group, turn, conv = key
        entry = {"group": group, "turn": turn, "prompt": conv}
        if (group, conv) in verdicts:
            entry.update(first_mismatch_pos=None, near_tie=verdicts[group, conv], after_earlier_turn=True)
        elif target is None:
            entry.update(first_mismatch_pos=first_difference(tokens, ref), near_tie=False)
        else:
            entry.update(first_mismatch(target, runs[group].prompts[turn, conv], tokens, ref).as_dict())
        verdicts.setdefault((group, conv), entry["near_tie"])
        mismatches.append(entry)
    fields = {"greedy_identical": not mismatches, "greedy_mismatches": mismatches[:10]}
    if mismatches:
        fields["greedy_near_ties_only"] = all(m["near_tie"] for m in mismatches)
    return fields


def category_rows(per: dict, convs: list[BenchPrompt], params) -> list[dict]:
    """Per-category tokens/s and speedup over plain, from batch-1 runs (one conversation per batch)."""
    cats = sorted({c.category for c in convs if c.category})
    rows = []
    for name, runs in per.items():
        for cat in cats:
            idx = [g for g, c in enumerate(convs) if c.category == cat]
            tok = sum(len(t) for g in idx for t in _tokens(runs[g]))
            ptok = sum(len(t) for g in idx for t in _tokens(per["plain"][g]))
            rate = tok / sum(runs[g].wall_s for g in idx)
            prate = ptok / sum(per["plain"][g].wall_s for g in idx)
            rows.append(
                {
                    "method": name,
                    "category": cat,
                    "temperature": params.temperature,
                    "prompts": len(idx),
                    "tokens_per_s": round(rate, 3),
                    "speedup_vs_plain": round(rate / prate, 4),
                }
            )
    return rows


def check_request_inputs(
    temperatures: list[float], batch_sizes: list[int], max_new: int, repeats: int
) -> None:
    if not temperatures or any(t < 0 for t in temperatures):
        raise BadInputError("--temperatures", temperatures, "comma-separated numbers >= 0, e.g. 0,1")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise BadInputError("--batch-sizes", batch_sizes, "comma-separated integers >= 1, e.g. 1,4,16")
    if max_new < 1:
        raise BadInputError("--max-new-tokens", max_new, "an integer >= 1")
    if repeats < 1:
        raise BadInputError("--repeats", repeats, "an integer >= 1")
