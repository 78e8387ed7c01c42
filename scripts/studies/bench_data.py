"""Data-recipe measurements behind BENCHMARKS.md (data recipes section), on the embedded target.

    python scripts/studies/bench_data.py --out runs/bench-data

1. prepare: the bundled ShareGPT, --prepare-samples kept rows at --max-length, timed.
2. regeneration throughput: first-turn prompts of --regen-prompts conversations answered by the
   decoding engine regenerate uses, one by one (batch 1) and batched (--batch-size), interleaved and
   repeated; generated tokens / wall time.
3. capture: the first --capture-samples prepared rows, bf16 storage: rows/s, tokens/s, bytes per token.
Writes OUT/data_bench.json and prints a Markdown summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

import datasets
import torch

from draftsmith.data_recipes.capture import capture
from draftsmith.data_recipes.prepare import prepare
from draftsmith.data_recipes.regenerate import chat_prompt_ids
from draftsmith.runtime.core.engine import decode_batch
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.sampling import SamplingParams


def regen_throughput(target, prompts, batch_size, max_new, repeats):
    """tokens/s of one-by-one vs batched greedy answering, interleaved, median over repeats."""
    rates = {1: [], batch_size: []}
    for rep in range(repeats):
        for bs in (1, batch_size) if rep % 2 == 0 else (batch_size, 1):
            start, tokens = time.perf_counter(), 0
            for i in range(0, len(prompts), bs):
                results = decode_batch(target, prompts[i : i + bs], SamplingParams(), max_new, None)
                tokens += sum(r.new_tokens for r in results)
            rates[bs].append(tokens / (time.perf_counter() - start))
    return {bs: statistics.median(v) for bs, v in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/bench-data")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--prepare-samples", type=int, default=1000)
    parser.add_argument("--regen-prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--regen-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--capture-samples", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    target = Target.load("smollm2-135m", device="cpu", dtype="float32")
    report = {"date": str(date.today()), "args": vars(args)}

    start = time.perf_counter()
    record = prepare(
        target, "sharegpt", out / "prepared", args.prepare_samples, args.max_length, progress=False
    )
    report["prepare"] = {
        "seconds": time.perf_counter() - start,
        "summary": record["summary"],
        **record["outputs"],
    }

    data = datasets.load_from_disk(str(out / "prepared"))["train"]
    prompts = []
    for row in data.select(range(args.regen_prompts)):
        messages = json.loads(row["messages"])
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompts.append(chat_prompt_ids(target, messages[:first])[-768:])  # keep prompts within the context
    decode_batch(target, prompts[:2], SamplingParams(), 4, None)  # warm-up
    rates = regen_throughput(target, prompts, args.batch_size, args.regen_new_tokens, args.repeats)
    report["regenerate"] = {
        "tokens_per_s_batch_1": rates[1],
        f"tokens_per_s_batch_{args.batch_size}": rates[args.batch_size],
    }

    small = out / "prepared-small"
    prepare(
        target,
        "sharegpt",
        small,
        args.capture_samples,
        args.max_length,
        validation_fraction=0.05,
        progress=False,
    )
    start = time.perf_counter()
    cap = capture(target, small, out / "captured", storage_dtype="bfloat16", progress=False)
    seconds = time.perf_counter() - start
    o = cap["outputs"]
    report["capture"] = {
        "seconds": seconds,
        "rows": o["rows"],
        "tokens": o["tokens"],
        "rows_per_s": o["rows"] / seconds,
        "tokens_per_s": o["tokens"] / seconds,
        "bytes": o["bytes"],
        "bytes_per_token": o["bytes_per_token"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_bench.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
