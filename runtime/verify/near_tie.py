"""Greedy identity with a near-tie rule: where a bf16/fp16 or GPU run of speculative
decoding and plain decoding part ways, was the target itself undecided there?

    mismatch = first_mismatch(target, prompt_ids, got_tokens, want_tokens)   # None: identical
    mismatch.near_tie, mismatch.gap, mismatch.tolerance                       # log the gap

Verification scores several tokens in one forward; plain decoding scores one. In fp32 on a CPU the two
agree to the last bit often enough that draftsmith demands identical tokens. In bf16 the same logit comes
out of differently shaped matmuls with different roundings, so where the target's top two logits are
within rounding of each other either choice is "the argmax". The rule (after transformers' assisted-generation
tests) allows a mismatch only at the *first* diverging step (after it the two continuations condition on
different text) and only if the target's logits for the two chosen tokens differ by at most a tolerance.
The tolerance here is a few units in the last place (ulp) of the target's dtype at the logits' magnitude:
4 ulp is 7.6e-6 for fp32 logits near 20 (transformers uses allclose 1e-5) and 0.5 for bf16 there.
The logits are recomputed by one plain forward over the prompt and the common prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ULPS = 4  # how many units in the last place two logits may differ by and still be a tie


@dataclass(frozen=True)
class Mismatch:
    position: int  # index into the new tokens of the first difference
    got: int | None  # the speculative run's token there (None: it had stopped)
    want: int | None  # plain decoding's token there (None: it had stopped)
    gap: float  # |logit(want) - logit(got)| in the target's own logits; inf if one run had stopped
    tolerance: float  # ULPS units in the last place of the target's dtype at the logits' magnitude

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.tolerance

    def as_dict(self) -> dict:
        gap = None if math.isinf(self.gap) else round(self.gap, 6)
        return {"first_mismatch_pos": self.position, "got": self.got, "want": self.want, "logit_gap": gap,
                "tolerance": self.tolerance, "near_tie": self.near_tie}  # fmt: skip


def tie_tolerance(magnitude: float, dtype: torch.dtype, ulps: int = ULPS) -> float:
    """`ulps` units in the last place of `dtype` at |logit| = magnitude (at least 1)."""
    return ulps * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(magnitude), 1.0)))


@torch.inference_mode()
def next_logits(target, ids: list[int]) -> torch.Tensor:
    """The target's logits [V] (float32 from its own dtype) after `ids`, by one plain forward."""
    x = torch.tensor([ids], device=target.device)
    cache = target.new_cache(1, len(ids))
    return target.logits(target.forward(x, cache).hidden[:, -1])[0]


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one extends the other)."""
    if got == want:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def first_mismatch(target, prompt: list[int], got: list[int], want: list[int]) -> Mismatch | None:
    """Compare a run's new tokens with plain decoding's (`want`) -> None when identical, else the first
    difference with the target's logit gap between the two tokens there."""
    pos = first_difference(got, want)
    if pos is None:
        return None
    mine = got[pos] if pos < len(got) else None
    theirs = want[pos] if pos < len(want) else None
    if mine is None or theirs is None:  # one run stopped where the other went on: no tie to weigh
        return Mismatch(pos, mine, theirs, math.inf, 0.0)
    logits = next_logits(target, prompt + want[:pos])  # [V]
    a, b = logits[theirs].item(), logits[mine].item()
    # a weight-only quantized target (runtime/core/quantize.py) rounds every linear's input and output,
    # its logits included, to bf16: its ties are bf16's, whatever dtype its embedding has
    dtype = torch.bfloat16 if getattr(target, "quantization", None) else target.dtype
    return Mismatch(pos, mine, theirs, abs(a - b), tie_tolerance(max(abs(a), abs(b)), dtype))
