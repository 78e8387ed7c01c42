"""Shared argparse pieces for the `draftsmith` verbs: the help formatter, typed flags, target flags."""

from __future__ import annotations

import argparse
import math


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def int_arg(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected an integer") from None

    return parse


def finite_float_arg(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected a number") from None
        if math.isnan(value):
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected a number, not NaN")
        return value

    return parse


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="smollm2-135m",
        help="alias (smollm2-135m, the embedded default), local HF folder, Hub id, or .gguf file",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu), float32, bfloat16")


def add_attention_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attention",
        choices=["sdpa", "triton", "flex"],
        default="sdpa",
        help="the target's attention where draftsmith passes a mask (tree steps, padded batches): sdpa "
        "(default), triton (draftsmith's kernel on CUDA, its reference elsewhere) or flex (FlexAttention, "
        "compiled on CUDA); unmasked causal steps stay on SDPA",
    )
