"""Sampling transforms shared by plain and speculative decoding (pure torch, no model).

`SamplingParams.validate()` rejects bad settings; `logits_to_probs` applies temperature, then top-k, then
top-p, in the same order as transformers' `generate()` logits warpers, so the distribution a draft token
is drawn from and the one the target is verified against are built by the same code (q taken
before top-k/top-p while sampling after is a known lossless-breaking bug: huggingface/transformers#47932).

Temperature 0 means greedy: `argmax` of the raw logits, first index on ties, exactly as `generate()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from draftsmith.runtime.errors import BadInputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        t, p, k = self.temperature, self.top_p, self.top_k
        if not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise BadInputError("temperature", t, "a finite number >= 0 (0 means greedy)")
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 < p <= 1.0:
            raise BadInputError("top_p", p, "a number in (0, 1]")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise BadInputError("top_k", k, "an integer >= 0 (0 disables top-k)")
        return self


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits [..., V] into the sampling distribution [..., V] (float32) for temperature > 0."""
    if params.greedy:
        raise ValueError("logits_to_probs is for temperature > 0; use greedy_tokens at temperature 0")
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        # Keep the smallest set of tokens whose mass reaches top_p (the top token always stays).
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # ascending mass
        drop_sorted = cum <= (1.0 - params.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim; ties go to the lowest id, as in `generate(do_sample=False)`."""
    return logits.argmax(dim=-1)


def make_generators(seed: int, rows: list[int], device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per sample row, seeded by (seed, row index): a row's randomness does not depend on
    which other rows share its batch, so a seeded run is reproducible at any batch size."""
    gens = []
    for row in rows:
        g = torch.Generator(device=device)
        g.manual_seed((seed * 1_000_003 + row) % (2**63))
        gens.append(g)
    return gens


def sample_from_probs(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Draw one token per row of probs [B, V] with that row's generator -> [B]."""
    out = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]
    return torch.cat(out)


def next_tokens(
    logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator] | None
) -> torch.Tensor:
    """Pick the next token for each row of logits [B, V] -> [B]."""
    if params.greedy:
        return greedy_tokens(logits)
    if generators is None or len(generators) != logits.shape[0]:
        raise ValueError("sampling needs one generator per row")
    return sample_from_probs(logits_to_probs(logits, params), generators)
