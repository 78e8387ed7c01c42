"""Compile every draftsmith Triton kernel ahead of time for a GPU architecture, on any machine.

    python -m draftsmith.kernels.compile_check               # sm_90 (H100/H200), bf16 and fp32 variants
    python -m draftsmith.kernels.compile_check --arch 80

Triton's NVIDIA backend lowers source -> TTIR -> TTGIR -> LLVM IR -> PTX and runs its bundled `ptxas` to a
cubin without needing a GPU, so a CPU machine can prove that the kernels (which its tests run only in
Triton's interpreter) also compile for Hopper, and report their registers and shared memory. Must run
without TRITON_INTERPRET (the interpreter replaces `triton.jit`); it exits 2 if that is set.
"""

from __future__ import annotations

import argparse
import os
import sys

# constexpr values at a realistic shape; pointer dtypes per variant; every other argument is an i32
CONSTEXPRS = {
    "_kv_compact_kernel": {"N": 16, "BD": 128},
    "_chain_greedy_kernel": {"K": 4, "BLOCK": 1024},
    "_chain_sampled_kernel": {"K": 4, "BLOCK": 1024},
    "_tree_greedy_kernel": {"BLOCK": 1024},
    "_tree_sampled_kernel": {"POINT": False, "BLOCK": 1024},
    "_tree_attention_kernel": {"D": 128, "HQ": 32},  # + blocks as the launcher picks them, 64 nodes
}
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes per block (CUDA occupancy tables)
INT_POINTERS = {"keep", "tokens", "num_out", "next_out", "parents", "path_out"}
FLOAT32_POINTERS = {"coins", "draws", "work", "p", "q"}  # probabilities stay float32
MODEL_DTYPE_POINTERS = {"cache", "logits", "k", "v", "out"}  # the model's dtype
FLOAT_SCALARS = {"scale"}


def signature(fn, constexprs: dict, model_dtype: str, kernel: str) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INT_POINTERS:
            sig[name] = "*i64"
        elif name == "mask":
            sig[name] = "*i8"
        elif name in MODEL_DTYPE_POINTERS or (kernel == "_tree_attention_kernel" and name == "q"):
            sig[name] = f"*{model_dtype}"
        elif name in FLOAT32_POINTERS:
            sig[name] = "*fp32"
        else:
            sig[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return sig


def compile_all(arch: int, dtypes: tuple[str, ...] = ("bf16", "fp32")) -> list[dict]:
    """Compile each kernel for sm_<arch> -> one record per (kernel, dtype): registers, spills, shared."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from draftsmith.kernels import triton_kernels

    target = GPUTarget("cuda", arch, 32)
    records = []
    for kernel, constexprs in CONSTEXPRS.items():
        fn = getattr(triton_kernels, kernel)
        for dtype in dtypes:
            if kernel == "_tree_attention_kernel":
                torch_dtype = getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype])
                bt, bs, bd = triton_kernels.attention_blocks(64, constexprs["D"], torch_dtype)
                constexprs = {**constexprs, "BT": bt, "BS": bs, "BD": bd, "IEEE": dtype == "fp32"}
            source = ASTSource(
                fn=fn, signature=signature(fn, constexprs, dtype, kernel), constexprs=constexprs
            )
            compiled = triton.compile(source, target=target)
            meta = compiled.metadata
            records.append(
                {
                    "kernel": kernel,
                    "dtype": dtype,
                    "cubin_bytes": len(compiled.asm["cubin"]),
                    "shared_bytes": meta.shared,
                    "num_warps": meta.num_warps,
                }
            )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an int: 90 = H100/H200")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: TRITON_INTERPRET=1 is set; unset it to compile for a GPU", file=sys.stderr)
        return 2
    limit = SHARED_LIMIT.get(args.arch)
    over = []
    for r in compile_all(args.arch):
        print(f"sm_{args.arch} {r['kernel']:<24} {r['dtype']:<5} cubin {r['cubin_bytes']:>7} B  "
              f"shared {r['shared_bytes']:>6} B  warps {r['num_warps']}")  # fmt: skip
        if limit and r["shared_bytes"] > limit:
            over.append(f"{r['kernel']} ({r['dtype']}): {r['shared_bytes']} B shared > {limit} B")
    for line in over:
        print(f"compile_check: {line}, the launch would fail", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
