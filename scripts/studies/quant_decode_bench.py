"""Plain decoding of the embedded target in fp32, int8 and int4 with draftsmith's engine, interleaved.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/studies/quant_decode_bench.py --rounds 3 --tokens 48
    OMP_NUM_THREADS=1 .venv/bin/python scripts/studies/quant_decode_bench.py --modes fp32,int8,int4,int4:32

Loads SmolLM2-135M three times (fp32, `--quantize int8`, `--quantize int4`: runtime/core/quantize.py),
decodes the same chat prompts greedily at batch 1, one precision after the other per round, and prints
the median tokens/s, the weight bytes a step reads (bench's roofline.weight_bytes) and how many of the
greedy tokens each quantized target shares with fp32 before the first difference. A quick check, not the
bench: `draftsmith bench --quantize int8 ...` gives the full rows.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from draftsmith.runtime.bench.roofline import weight_bytes
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.quantize import parse_quantize, quantize_target
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.sampling import SamplingParams

PROMPTS = ["Why is the sky blue?", "Write a Python function that reverses a list.", "What is TCP?"]


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument(
        "--modes", default="fp32,int8,int4", help="fp32, int8, int4 or int4:GROUP, comma-separated"
    )
    args = ap.parse_args()
    targets = {}
    for mode in args.modes.split(","):
        target = Target.load("smollm2-135m", device="cpu", dtype="float32")
        if mode != "fp32":  # int8, int4 or int4:GROUP
            name, _, group = mode.partition(":")
            quantize_target(target, parse_quantize(name, int(group) if group else None))
        targets[mode] = target
    prompts = [targets["fp32"].encode(p) for p in PROMPTS]
    greedy = SamplingParams()
    for target in targets.values():  # warm-up
        generate_plain(target, prompts[:1], greedy, 4, progress=False)
    speeds: dict[str, list[float]] = {mode: [] for mode in targets}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for mode, target in targets.items():
            for prompt in prompts:
                (res,) = generate_plain(target, [prompt], greedy, args.tokens, progress=False)
                speeds[mode].append(res.new_tokens / res.wall_s)
            tokens[mode] = [
                r.token_ids for r in generate_plain(target, prompts, greedy, args.tokens, progress=False)
            ]
    for mode, target in targets.items():
        read, _ = weight_bytes(target.model)
        shared = [common_prefix(a, b) for a, b in zip(tokens[mode], tokens["fp32"], strict=True)]
        print(
            f"{target.quantization or 'fp32':10s} {statistics.median(speeds[mode]):6.1f} tok/s (median of "
            f"{len(speeds[mode])}: {min(speeds[mode]):.1f}..{max(speeds[mode]):.1f}), "
            f"{read / 1e6:6.1f} MB/step, "
            f"greedy tokens shared with fp32 before the first difference: {shared}"
        )
    print({"threads": torch.get_num_threads(), "tokens": args.tokens, "rounds": args.rounds})


if __name__ == "__main__":
    main()
