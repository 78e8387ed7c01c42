"""transformers `generate()` as a baseline: same prompts, same budget, same sampling settings.

Timing side by side with draftsmith's methods is `draftsmith.runtime.bench.speed`; tests compare draftsmith's
greedy tokens with these token for token.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.kernel_attention import transformers_sdpa
from draftsmith.runtime.core.row_linear import torch_linears
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.sampling import SamplingParams


def hf_generate(target: Target, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers `generate(do_sample=False)` continuing prompt_ids; returns new tokens (EOS kept)."""
    return hf_generate_batch(target, [prompt_ids], max_new_tokens)[0]


@torch.inference_mode()
def hf_generate_batch(
    target: Target,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    **generate_kwargs,
) -> list[list[int]]:
    """`generate()` on a left-padded batch (greedy unless `params` samples); new tokens per row, cut after
    the first EOS. Sampling uses exactly `params` (the model's generation_config defaults are overridden).
    `generate_kwargs` go to generate() as they are (a streamer, prompt_lookup_num_tokens, ...)."""
    params = params or SamplingParams()
    sampling = (
        {"do_sample": False}
        if params.greedy
        else {
            "do_sample": True,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
        }
    )
    width = max(map(len, prompts))
    pad = target.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
    # the baseline is transformers as users run it, whatever --attention or --cpu-linears say
    with transformers_sdpa(target), torch_linears(target.model):
        out = target.model.generate(
            input_ids,
            attention_mask=mask,
            **sampling,
            max_new_tokens=max_new_tokens,
            eos_token_id=target.eos_token_ids,
            pad_token_id=pad,
            **generate_kwargs,
        )
    rows = []
    for row in out[:, width:].tolist():
        ends = [i for i, tok in enumerate(row) if tok in target.eos_token_ids]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows
