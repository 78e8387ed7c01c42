"""Runtime measurements behind BENCHMARKS.md (speculative runtime section), on the embedded target.

    python scripts/studies/bench_runtime.py verify-cost          # one tree verification forward vs node count
    python scripts/studies/bench_runtime.py speedup --max-new-tokens 64  # drafters vs plain, side by side
    python scripts/studies/bench_runtime.py compare --prompt-set humaneval --temperatures 0,1 \
        --methods "hf;ngram@chain:2;eagle3:runs/eagle3-smollm2-135m/final@chain:4"

verify-cost: after a 200-token prefix, time one target forward over N tree nodes (a binary-ish tree,
tree mask, per-node positions) for N in --nodes, interleaved across N, median of --repeats.
compare: compare_methods (scripts/studies/speed_compare.py) on a prompt set (sharegpt held out,
humaneval, jsonl:FILE) at each temperature: plain decoding and every method in a rotating order per prompt (so
drift hits all alike) after a warm-up; tokens/s, speedup of summed tokens/s and the median of per-prompt
speedups, tau, acceptance per position, draft forwards per token, greedy identity with plain decoding.
speedup: compare on --prompts (default configs/prompts/runtime-bench.jsonl) at temperature 0.
Results go to --out as JSON; tables are printed in Markdown.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, position_ids

DEFAULT_METHODS = (
    "ngram@chain:4",
    "ngram@dynamic:depth=4,topk=2,tokens=8",
    "self:layers=20@chain:2",
    "self:layers=27@chain:2",
    "self:layers=27@chain:4",
    "self:layers=27@dynamic:depth=3,topk=2,tokens=6",
)


def verify_cost(target: Target, nodes: list[int], repeats: int) -> list[dict]:
    prefix = torch.randint(100, 40000, (1, 200))
    times: dict[int, list[float]] = {n: [] for n in nodes}
    for rep in range(repeats + 1):  # the first round warms up
        for n in nodes:
            tree = Tree(tuple([-1] + [(i - 1) // 2 for i in range(1, n)]))  # binary, topological
            cache = target.new_cache(1, 200 + n)
            target.forward(prefix, cache)
            ids = torch.randint(100, 40000, (1, n))
            mask = None if n == 1 else ancestor_mask(tree)
            start = time.perf_counter()
            out = target.forward(ids, cache, position_ids(tree, 200)[None], tree_mask=mask)
            target.logits(out.hidden)
            if rep:
                times[n].append(time.perf_counter() - start)
    base = statistics.median(times[nodes[0]])
    return [
        {"nodes": n, "ms": 1000 * statistics.median(times[n]), "vs_1": statistics.median(times[n]) / base}
        for n in nodes
    ]


def compare(target: Target, args, meta: dict, out: Path) -> None:
    from speed_compare import compare_methods, format_rows

    from draftsmith.runtime.bench.prompt_sets import load_prompt_set

    prompts = [target.encode(t) for t in load_prompt_set(args.prompt_set, args.num_prompts)]
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        part = compare_methods(
            target,
            args.methods.split(";"),
            prompts,
            SamplingParams(temperature=temperature),
            args.max_new_tokens,
        )
        print(
            f"\n{args.prompt_set}: {len(prompts)} prompts, {args.max_new_tokens} new tokens, "
            f"T={temperature:g}"
        )
        print(format_rows(part), flush=True)
        rows += part
    name = f"compare-{args.prompt_set.replace(':', '-').replace('/', '_')}.json"
    (out / name).write_text(json.dumps({**meta, "prompt_set": args.prompt_set, "rows": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["verify-cost", "speedup", "compare"])
    parser.add_argument("--prompt-set", default="sharegpt", help="compare: sharegpt, humaneval, jsonl:FILE")
    parser.add_argument("--temperatures", default="0", help="compare: comma-separated")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--nodes", default="1,2,4,6,8,12,16,24,32,48,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--methods", default=",".join(DEFAULT_METHODS).replace(",", ";"), help="';'-separated"
    )
    parser.add_argument("--prompts", default="configs/prompts/runtime-bench.jsonl", help="speedup: the file")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/bench-runtime")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = Target.load(args.target, device="cpu", dtype="float32")
    meta = {
        "date": str(date.today()),
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "command": "python scripts/studies/bench_runtime.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "verify-cost":
        rows = verify_cost(target, [int(n) for n in args.nodes.split(",")], args.repeats)
        print("| nodes | ms (median) | x one node |\n|---:|---:|---:|")
        for r in rows:
            print(f"| {r['nodes']} | {r['ms']:.1f} | {r['vs_1']:.2f} |")
        (out / "verify_cost.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        return
    if args.what == "speedup":
        args.prompt_set, args.temperatures = f"jsonl:{args.prompts}", "0"
    compare(target, args, meta, out)


if __name__ == "__main__":
    main()
