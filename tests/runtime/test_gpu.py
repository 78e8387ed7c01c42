"""GPU path (`pytest -m gpu`): the engine on CUDA equals transformers there. Skipped without CUDA."""

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.bench.side_by_side import hf_generate
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_greedy_identity_on_cuda_fp32():
    target = Target(tiny_model("llama").to("cuda"), tiny_tokenizer(), "tiny-cuda")
    prompts = [[4, 7, 8, 9, 5], [4, 10, 11, 5], [4, 12, 5]]
    ours = generate_plain(target, prompts, SamplingParams(), max_new_tokens=24, batch_size=3)
    for res, ids in zip(ours, prompts):
        assert res.token_ids == hf_generate(target, ids, 24)
