"""The static path's attention windows, side by side: steps attending over the used slots (rounded up to
SPAN_STEP = 256, runtime/core/static_forward.py) against over the whole static capacity, and the dynamic path.

    python scripts/studies/static_window_bench.py --head runs/eagle3-smollm2-135m/final --batch 8 --repeats 3

Plain decoding and the head's chain:3 at one batch size on held-out ShareGPT prompts (greedy); each
repeat runs every (method, path) once, in one interleaved order after a warm-up; medians of tokens/s.
On a CPU the static path runs eagerly (no graphs), so this shows what the window saves in attention.
"""

from __future__ import annotations

import argparse
import statistics
import time

from draftsmith.runtime.bench.prompt_sets import load_prompt_set
from draftsmith.runtime.core import static_forward
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

PATHS = {"dynamic": None, "static, windows": 256, "static, whole capacity": 1 << 30}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--head", default="runs/eagle3-smollm2-135m/final")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target = Target.load("smollm2-135m", device="cpu", dtype="float32")
    prompts = [target.encode(p) for p in load_prompt_set("sharegpt", args.batch)]
    drafter = build_drafter(f"eagle3:{args.head}", target, parse_tree_spec("chain:3"))
    greedy, n = SamplingParams(), args.max_new_tokens

    def run(method: str, path: str):
        static_forward.SPAN_STEP = PATHS[path] or 256
        static = PATHS[path] is not None
        if method == "plain":
            return generate_plain(target, prompts, greedy, n, batch_size=args.batch, static=static)
        return generate_speculative(target, drafter, prompts, greedy, n, batch_size=args.batch, static=static)

    keys = [(m, p) for m in ("plain", "eagle3 chain:3") for p in PATHS]
    rates: dict = {k: [] for k in keys}
    tokens = {}
    for key in keys:  # warm-up
        tokens[key] = [r.token_ids for r in run(*key)]
    assert all(tokens[k] == tokens[keys[0]] for k in keys), "every path must emit plain decoding's tokens"
    for _ in range(args.repeats):
        for key in keys:
            start = time.perf_counter()
            results = run(*key)
            rates[key].append(sum(len(r.token_ids) for r in results) / (time.perf_counter() - start))
    print(f"| method (batch {args.batch}) | path | tok/s (median of {args.repeats}) | vs dynamic |")
    print("|---|---|---:|---:|")
    for method, path in keys:
        rate, base = statistics.median(rates[(method, path)]), statistics.median(rates[(method, "dynamic")])
        print(f"| {method} | {path} | {rate:.1f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
