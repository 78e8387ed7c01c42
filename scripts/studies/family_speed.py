"""Plain decoding against transformers' generate(), and n-gram tau, on each new family's tiny target.

    OMP_NUM_THREADS=1 nice -n 10 python scripts/studies/family_speed.py                   # markdown table
    OMP_NUM_THREADS=1 python scripts/studies/family_speed.py --families gemma2 --max-new-tokens 32 --json

Each family's tiny random model (tests/family_models.py: hidden 64, vocabulary 128, 3-6 layers, saved as
a sharded safetensors folder under --dir, a temporary folder by default) is loaded through `Target.load`
(fp32, CPU). At batch 1, `speed_compare.py` runs plain decoding, transformers' `generate()` (`hf`) and
`ngram@chain:3` side by side on the same prompts (warm-up first, rotating order, median of
--repeats); at batch 4 the whole prompt set is decoded in batches of 4 by draftsmith's engine and by
`generate()` on left-padded batches (median of --repeats), and by the n-gram drafter. tau is tokens
committed per target forward (the bonus token counted). "identical" checks at temperature 0 that
`hf` and n-gram (batch 1 and 4) give plain decoding's tokens, row for row. The prompts are
tests/engine_checks.py's `make_prompts` (random words, each repeating a 4-gram: n-gram lookup has
something to find). Tiny models make every step launch-bound, so tokens/s here measure the engine's
per-step overhead against transformers', not the models' arithmetic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

NGRAM = "ngram@chain:3"


def timed(fn, repeats: int):
    """(median wall seconds, the last result) of `repeats` calls."""
    walls, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), out


def measure(target, prompts: list[list[int]], max_new: int, repeats: int) -> dict:
    from speed_compare import compare_methods

    from draftsmith.runtime.bench.side_by_side import hf_generate_batch
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.ngram import NgramDrafter
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import parse_tree_spec

    greedy = SamplingParams()
    rows = {
        r["method"]: r
        for r in compare_methods(target, ["hf", NGRAM], prompts, greedy, max_new, repeats, progress=False)
    }
    plain1 = generate_plain(target, prompts, greedy, max_new)

    def hf4():
        return [
            row
            for i in range(0, len(prompts), 4)
            for row in hf_generate_batch(target, prompts[i : i + 4], max_new)
        ]

    hf4()  # warm-up
    plain_s, plain4 = timed(lambda: generate_plain(target, prompts, greedy, max_new, batch_size=4), repeats)
    hf_s, hf_rows = timed(hf4, repeats)
    drafter = NgramDrafter(parse_tree_spec(NGRAM.split("@")[1]))
    ngram4 = generate_speculative(target, drafter, prompts, greedy, max_new, batch_size=4)
    tokens = sum(len(r.token_ids) for r in plain4)
    want = [r.token_ids for r in plain1]
    return {
        "params": sum(p.numel() for p in target.model.parameters()),
        "plain_b1": rows["plain"]["tokens_per_s"],
        "hf_b1": rows["hf"]["tokens_per_s"],
        "plain_b4": round(tokens / plain_s, 1),
        "hf_b4": round(sum(len(r) for r in hf_rows) / hf_s, 1),
        "ngram_tau_b1": rows[NGRAM]["mean_accepted"],
        "ngram_tau_b4": round(sum(r.new_tokens for r in ngram4) / sum(r.target_forwards for r in ngram4), 3),
        "identical": {
            "hf_b1": rows["hf"]["greedy_identical"],
            "ngram_b1": rows[NGRAM]["greedy_identical"],
            "plain_b4": [r.token_ids for r in plain4] == want,
            "hf_b4": hf_rows == want,
            "ngram_b4": [r.token_ids for r in ngram4] == want,
        },
    }


def table(results: dict[str, dict], prompts: int, max_new: int) -> str:
    lines = [
        f"{prompts} prompts x {max_new} new tokens, greedy, fp32, CPU "
        f"(torch threads {torch.get_num_threads()})",
        "",
        "| family | params | plain tok/s b1 | hf tok/s b1 | plain/hf b1 | plain tok/s b4 | hf tok/s b4 "
        "| plain/hf b4 | ngram tau b1 | ngram tau b4 | greedy identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family, r in results.items():
        same = "yes" if all(r["identical"].values()) else f"NO {r['identical']}"
        lines.append(
            f"| {family} | {r['params'] / 1e3:.0f}k | {r['plain_b1']:.0f} | {r['hf_b1']:.0f} "
            f"| {r['plain_b1'] / r['hf_b1']:.2f} | {r['plain_b4']:.0f} | {r['hf_b4']:.0f} "
            f"| {r['plain_b4'] / r['hf_b4']:.2f} | {r['ngram_tau_b1']:.2f} | {r['ngram_tau_b4']:.2f} "
            f"| {same} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from engine_checks import make_prompts
    from family_models import FAMILY_NAMES, make_family_dir
    from transformers.utils import logging as hf_logging

    from draftsmith.runtime.core.target import Target

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILY_NAMES), choices=FAMILY_NAMES)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the tiny folders go (default: a tmp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    args = parser.parse_args(argv)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    prompts = make_prompts(args.prompts)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or Path(tmp)
        for family in args.families:
            folder = root / family
            if not (folder / "config.json").is_file():
                make_family_dir(folder, family)
            target = Target.load(str(folder), device="cpu", dtype="float32")
            results[family] = measure(target, prompts, args.max_new_tokens, args.repeats)
            print(f"{family}: done", file=sys.stderr)
    print(table(results, len(prompts), args.max_new_tokens))
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
