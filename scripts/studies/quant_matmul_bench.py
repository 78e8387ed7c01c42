"""Weight-only quantized matmuls on the CPU: which kernel is fastest for the embedded target's shapes.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/studies/quant_matmul_bench.py            # aten kernels only
    PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python scripts/studies/quant_matmul_bench.py --json out.json

It builds, per method, SmolLM2-135M's whole stack of linears with random weights (30 layers of q/o
576x576, k/v 192x576, gate/up 1536x576, down 576x1536 (N out x K in), then the tied LM head 49152x576)
and times one pass over it at M = 1..8 rows, as a decode or verification step reads them: every weight
once, so nothing stays in the 32 MiB L3 between uses (a loop over one 576x576 weight would time cached
reads, 3-4x faster than a decode step sees). Methods, interleaved per round after a warm-up pass:
- fp32: F.linear on the fp32 weight (the baseline); bf16: F.linear with weights and activations in bf16;
- int8: torch.ops.aten._weight_int8pack_mm (per-output-channel scales: the kernel takes [N] scales only)
  and torchao's Int8WeightOnlyConfig (when importable);
- int4: torch.ops.aten._weight_int4pack_mm_for_cpu on _convert_weight_to_int4pack_for_cpu's packing
  (group-wise scale and zero, `--group`) and torchao's PrototypeInt4WeightOnlyConfig (its CPU int4 path).
The quantized kernels take bf16 activations (cast in, fp32 out): `--slow-path-check` first shows what
they cost with fp32 activations (a scalar path, 10-40x slower). Each cell is the median over rounds; the
layers' 210 linears and the LM head are timed apart. runtime/core/quantize.py quotes the numbers.
torchao is optional (never a dependency): pass it on PYTHONPATH, e.g. after
`pip install --no-deps --target DIR torchao` (its wheel pulls no CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

LAYER_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
HEAD_SHAPE = (49152, 576)
NUM_LAYERS = 30
BF16 = torch.bfloat16


def int8_weight(w: torch.Tensor, act: torch.dtype):
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127  # [N]
    q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)  # [N, K]
    scale = scale.to(act)
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scale)


def int4_weight(w: torch.Tensor, group: int, act: torch.dtype):
    n, k = w.shape
    wg = w.view(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)  # [N, G]
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    zero = lo + 8 * scale  # the kernel dequantizes (q - 8) * scale + zero
    q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(act)  # [G, N, 2]
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)


def torchao_weight(w: torch.Tensor, kind: str, group: int, act: torch.dtype):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=act)
    lin.weight.data.copy_(w)
    if kind == "int8":
        quantize_(lin, Int8WeightOnlyConfig())
    else:
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        quantize_(lin, PrototypeInt4WeightOnlyConfig(group_size=group, set_inductor_config=False))
    return lin


def bf16_linear(w: torch.Tensor):
    return lambda x: F.linear(x, w)


def builders(group: int, use_torchao: bool) -> dict:
    """method -> (activation dtype, build(fp32 weight) -> callable on activations of that dtype)."""
    out = {
        "fp32 F.linear": (torch.float32, lambda w: lambda x, w=w: F.linear(x, w)),
        "bf16 F.linear": (BF16, lambda w: bf16_linear(w.to(BF16))),
        "int8 aten": (BF16, lambda w: int8_weight(w, BF16)),
        "int4 aten": (BF16, lambda w: int4_weight(w, group, BF16)),
    }
    if use_torchao:
        out["int8 torchao"] = (BF16, lambda w: torchao_weight(w, "int8", group, BF16))
        out["int4 torchao"] = (BF16, lambda w: torchao_weight(w, "int4", group, BF16))
    return out


def run_pass(layers: list, head, x_small: torch.Tensor, x_wide: torch.Tensor) -> tuple[float, float]:
    """One pass over the layers' linears, then the LM head -> (layers seconds, head seconds)."""
    start = time.perf_counter()
    for fns in layers:
        for j, fn in enumerate(fns):
            fn(x_wide if j == 6 else x_small)  # down_proj reads the 1536-wide MLP activation
    mid = time.perf_counter()
    head(x_small)
    return mid - start, time.perf_counter() - mid


def slow_path_check(group: int) -> None:
    """The aten kernels with fp32 activations (cache-hot, one 1536x576 weight, M = 1)."""
    w, x = torch.randn(1536, 576) * 0.02, torch.randn(1, 576)

    def clock(fn, n=30):
        fn(x)
        start = time.perf_counter()
        for _ in range(n):
            fn(x)
        return (time.perf_counter() - start) / n * 1e6

    base = clock(lambda x: F.linear(x, w))
    i8, i4 = int8_weight(w, torch.float32), int4_weight(w, group, torch.float32)
    i8b, i4b = int8_weight(w, BF16), int4_weight(w, group, BF16)
    print(
        f"slow-path check 1536x576 M=1 (cache-hot, us): fp32 F.linear {base:.1f}; int8 aten fp32-act "
        f"{clock(i8):.1f}, bf16-act {clock(lambda x: i8b(x.to(BF16))):.1f}; int4 aten fp32-act "
        f"{clock(i4):.1f}, bf16-act {clock(lambda x: i4b(x.to(BF16))):.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    ap.add_argument(
        "--group", type=int, default=64, help="int4 group size (576 = 9 x 64: 128 does not divide)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import torchao  # noqa: F401

        use_torchao = True
    except ImportError:
        use_torchao = False
    torch.manual_seed(0)
    slow_path_check(args.group)
    methods = builders(args.group, use_torchao)
    weights = [[torch.randn(n, k) * 0.02 for n, k in LAYER_SHAPES] for _ in range(NUM_LAYERS)]
    head_w = torch.randn(*HEAD_SHAPE) * 0.02
    stacks = {
        name: (act, [[build(w) for w in layer] for layer in weights], build(head_w))
        for name, (act, build) in methods.items()
    }
    del weights, head_w
    results: dict[int, dict[str, dict[str, float]]] = {}
    for m in [int(r) for r in args.rows.split(",")]:
        xs = {
            act: (torch.randn(m, 576).to(act), torch.randn(m, 1536).to(act)) for act, _, _ in stacks.values()
        }
        samples = {name: [] for name in stacks}
        for r in range(args.rounds + 1):  # round 0 warms up
            for name, (act, layers, head) in stacks.items():
                if r:
                    samples[name].append(run_pass(layers, head, *xs[act]))
                else:
                    run_pass(layers, head, *xs[act])
        results[m] = {
            name: {
                "layers_ms": statistics.median(s[0] for s in v) * 1e3,
                "head_ms": statistics.median(s[1] for s in v) * 1e3,
            }
            for name, v in samples.items()
        }
        print(
            f"M={m}: "
            + "  ".join(f"{a}: {c['layers_ms']:.1f}+{c['head_ms']:.1f}" for a, c in results[m].items())
            + "  (ms: 210 layer linears + LM head)"
        )
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }
    print(meta)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "group": args.group, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
