"""One layer's tree-verification attention, timed three ways side by side: SDPA with draftsmith's boolean
mask (the runtime's default, = kernels.tree_attention_ref), the Triton kernel (kernels.tree_attention, on
CUDA) and FlexAttention (gpu_kernels/flex.py), with its block mask built in the call (the per-cycle cost: the
tree changes every cycle) and prebuilt. Issue 9: FlexAttention replaces the kernel only if measured faster.

    python scripts/studies/attention_bench.py --out runs/gpu-check/attention.json    # on a GPU (gpu_check.sh)
    python scripts/studies/attention_bench.py --device cpu --compile --context 512 --batches 1 \
        --out /tmp/a.json

Shape: Llama-3.1-8B's attention (32 query heads, 8 KV heads, head dim 128), batch 1 and 8, n = 1..128 tree
nodes (a chain: the mask's shape matters, not its pattern) after `--context` cached tokens. Each method
is checked against the fp32 reference (max |difference| recorded), warmed up (compiles), then timed in
interleaved rounds; the figure is the median over rounds of the mean ms per call. Writes one JSON and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from draftsmith import kernels
from draftsmith.kernels.flex import dense_block_mask, tree_attention_flex
from draftsmith.kernels.reference import tree_attention_ref

HEADS, KV_HEADS, DIM = 32, 8, 128


def case(batch: int, nodes: int, context: int, device):
    """q [B, 32, n, 128], k/v [B, 8, context + n, 128], mask [B, 1, n, context + n] (prefix + causal)."""
    g = torch.Generator().manual_seed(nodes)
    q = torch.randn(batch, HEADS, nodes, DIM, generator=g)
    k, v = (torch.randn(batch, KV_HEADS, context + nodes, DIM, generator=g) for _ in range(2))
    mask = torch.ones(batch, 1, nodes, context + nodes, dtype=torch.bool)
    mask[..., context:] = torch.ones(nodes, nodes, dtype=torch.bool).tril()
    return [t.to(device) for t in (q, k, v)], mask.to(device)


def methods(device: torch.device, compiled: bool | None) -> dict:
    """name -> fn(q, k, v, mask, scale, block_mask); the Triton kernel only where it compiles (CUDA)."""
    out = {
        "sdpa": lambda q, k, v, m, s, bm: tree_attention_ref(q, k, v, m, s),
        "flex": lambda q, k, v, m, s, bm: tree_attention_flex(q, k, v, m, s, compiled=compiled),
        "flex, block mask prebuilt": lambda q, k, v, m, s, bm: tree_attention_flex(
            q, k, v, m, s, bm, compiled
        ),
    }
    if kernels.use_triton(device) and device.type == "cuda":
        out["triton"] = lambda q, k, v, m, s, bm: kernels.tree_attention(q, k, v, m, s)
    return out


def timed(fn, sync, calls: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return 1000 * (time.perf_counter() - start) / calls


def measure(device, dtype, batches, nodes, context, rounds, calls, compiled=None) -> list[dict]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fns, rows = methods(device, compiled), []
    for batch in batches:
        for n in nodes:
            (q, k, v), mask = case(batch, n, context, device)
            want = tree_attention_ref(q, k, v, mask, DIM**-0.5)  # fp32 oracle
            q, k, v = (t.to(dtype) for t in (q, k, v))
            inputs = (q, k, v, mask, DIM**-0.5, dense_block_mask(mask))
            bound = {name: functools.partial(f, *inputs) for name, f in fns.items()}
            error = {name: (f().float() - want).abs().max().item() for name, f in bound.items()}  # + warm-up
            ms = {name: [] for name in bound}
            for _ in range(rounds):  # interleaved: drift hits every method alike
                for name, f in bound.items():
                    ms[name].append(timed(f, sync, calls))
            row = {"batch": batch, "nodes": n, "context": context}
            for name in bound:
                row[name] = {"ms": round(statistics.median(ms[name]), 4), "max_abs_error": error[name]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def print_table(result: dict) -> None:
    names = [k for k in result["rows"][0] if k not in ("batch", "nodes", "context")]
    print(f"\n{result['device']} ({result['dtype']}, flex {result['flex']}), one layer, 8B attention shape,"
          " ms per call")  # fmt: skip
    print("| batch | nodes | " + " | ".join(names) + " |\n|---:|---:|" + "---:|" * len(names))
    for row in result["rows"]:
        cells = " | ".join(f"{row[n]['ms']}" for n in names)
        print(f"| {row['batch']} | {row['nodes']} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--context", type=int, default=2048, help="cached tokens before the tree")
    parser.add_argument("--nodes", default="1,16,64,128", help="tree sizes, comma-separated")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed round")
    parser.add_argument(
        "--compile", action="store_true", help="compile FlexAttention off CUDA too (inductor's CPU backend)"
    )
    parser.add_argument("--out", default="runs/gpu-check/attention.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    os.environ.setdefault("DRAFTSMITH_KERNELS", "triton")  # the kernel is explicit (gpu_kernels/__init__.py)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "flex": "compiled" if args.compile or device.type == "cuda" else "eager",
        "rows": measure(device, dtype, [int(b) for b in args.batches.split(",")],
                        [int(n) for n in args.nodes.split(",")], args.context, args.rounds, args.calls,
                        True if args.compile else None),
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_table(result)


if __name__ == "__main__":
    main()
