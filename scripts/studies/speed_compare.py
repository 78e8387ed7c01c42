"""Side-by-side speed of decoding methods on one prompt set, at one temperature, in one run: the studies'
harness (bench_runtime.py, family_speed.py import it by name); `draftsmith bench` (runtime/bench/run.py) is
the product's.

    rows = compare_methods(target, ["plain", "hf", "ngram@chain:2", "eagle3:DIR@chain:4"], prompts,
                           SamplingParams(temperature=0.0), max_new_tokens=64)
    print(format_rows(rows))

A method is `plain` (draftsmith, no draft), `hf` (transformers `generate()`), or `DRAFT@TREE` with a
`--draft` and a `--tree` spec. Fairness (BENCHMARKS.md rules): every method decodes the same prompts with
the same budget; each method runs once on a short prompt first (warm-up); per prompt the methods run in
a rotating order so drift hits all alike; with repeats, each prompt's time is the median. Speedup is
tokens/s over plain decoding's tokens/s; at temperature 0 every method's tokens are compared with plain
decoding's (`greedy_identical`), and a mismatch is reported, never averaged away. At temperature > 0
each (method, prompt) uses the same seed, and outputs legitimately differ between methods.
"""

from __future__ import annotations

import statistics
import time

from tqdm.auto import tqdm

from draftsmith.runtime.core.engine import accept_rates, generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec


def _hf(target, prompt, params: SamplingParams, max_new: int, seed: int) -> list[int]:
    import torch

    from draftsmith.runtime.bench.side_by_side import hf_generate_batch

    torch.manual_seed(seed)
    return hf_generate_batch(target, [prompt], max_new, params)[0]


class MethodRunner:
    """Builds each drafter once (a head loads once), then decodes one prompt per call."""

    def __init__(self, target, methods: list[str]):
        self.target = target
        self.drafters = {}
        for method in methods:
            if method not in ("plain", "hf"):
                draft, _, tree = method.partition("@")
                self.drafters[method] = build_drafter(draft, target, parse_tree_spec(tree or "chain:2"))

    def __call__(self, method: str, prompt: list[int], params: SamplingParams, max_new: int, seed: int):
        """-> (new token ids, GenerationResult or None for hf)"""
        if method == "hf":
            return _hf(self.target, prompt, params, max_new, seed), None
        if method == "plain":
            res = generate_plain(self.target, [prompt], params, max_new, seed=seed)[0]
        else:
            res = generate_speculative(
                self.target, self.drafters[method], [prompt], params, max_new, seed=seed
            )[0]
        return res.token_ids, res


def compare_methods(
    target,
    methods: list[str],
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    names = ["plain", *[m for m in methods if m != "plain"]]
    run = MethodRunner(target, names)
    warm = min(prompts, key=len)
    for name in names:
        run(name, warm, params, 8, seed)
    per = {name: [] for name in names}  # (wall_s, tokens, result)
    bar = tqdm(total=len(prompts) * len(names), desc="side by side", unit="run", disable=not progress)
    for i, prompt in enumerate(prompts):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            walls, out = [], None
            for _ in range(repeats):
                start = time.perf_counter()
                out = run(name, prompt, params, max_new_tokens, seed + i)
                walls.append(time.perf_counter() - start)
            per[name].append((statistics.median(walls), *out))
            bar.update(1)
    bar.close()
    return summarize(per, params)


def summarize(per: dict, params: SamplingParams) -> list[dict]:
    plain = per["plain"]
    plain_rate = sum(len(t) for _, t, _ in plain) / sum(w for w, _, _ in plain)
    hf_rate = None
    if "hf" in per:
        hf_rate = sum(len(t) for _, t, _ in per["hf"]) / sum(w for w, _, _ in per["hf"])
    rows = []
    for name, runs in per.items():
        tokens = sum(len(t) for _, t, _ in runs)
        rate = tokens / sum(w for w, _, _ in runs)
        results = [r for _, _, r in runs if r is not None]
        row = {
            "method": name,
            "temperature": params.temperature,
            "prompts": len(runs),
            "new_tokens": tokens,
            "tokens_per_s": round(rate, 2),
            "speedup_vs_plain": round(rate / plain_rate, 3),
            "speedup_vs_hf": round(rate / hf_rate, 3) if hf_rate else None,
            "median_prompt_speedup": round(
                statistics.median(
                    (len(t) / w) / (len(pt) / pw) for (w, t, _), (pw, pt, _) in zip(runs, plain, strict=True)
                ),
                3,
            ),
        }
        if results:
            forwards = sum(r.target_forwards for r in results)
            lengths = [a for r in results for a in r.accepted_lengths]
            depths = [d for r in results for d in r.draft_depths]
            row["mean_accepted"] = round(sum(r.new_tokens for r in results) / forwards, 3)
            row["accept_rate_per_position"] = [round(x, 3) for x in accept_rates(lengths, depths)]
            row["draft_forwards_per_token"] = round(
                sum(r.draft_forwards for r in results) / max(tokens, 1), 3
            )
        if params.greedy:
            row["greedy_identical"] = all(t == pt for (_, t, _), (_, pt, _) in zip(runs, plain, strict=True))
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    """A Markdown table of compare_methods rows."""
    head = (
        "| method | T | tok/s | speedup vs plain | vs hf | tau | acceptance per position | greedy identical |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        vs_hf = f"{r['speedup_vs_hf']:.2f}" if r.get("speedup_vs_hf") else "-"
        tau = f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else "-"
        accept = str(r.get("accept_rate_per_position", "-"))
        same = str(r.get("greedy_identical", "n/a (sampling)"))
        lines.append(
            f"| {r['method']} | {r['temperature']:g} | {r['tokens_per_s']:.1f} | {r['speedup_vs_plain']:.2f} "
            f"| {vs_hf} | {tau} | {accept} | {same} |"
        )
    return "\n".join(lines)
