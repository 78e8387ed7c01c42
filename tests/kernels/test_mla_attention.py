"""Tree-verification attention through draftsmith.kernels on an MLA target, whose attention function gets
keys (qk_nope + qk_rope wide) and values (v_head_dim) of different widths: runtime/core/kernel_attention.py
pads the narrower side with zeros, which changes neither the scores nor the output's real columns.

    OMP_NUM_THREADS=1 python -m pytest tests/kernels/test_mla_attention.py -q
"""

import pytest
import torch
from tiny_mla import mla_sums, tiny_deepseek
from tiny_models import tiny_tokenizer
from tolerances import assert_rounding_close

from draftsmith import kernels
from draftsmith.runtime.core.kernel_attention import tree_attention_forward, use_kernel_attention
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.tree import ancestor_mask, parse_tree_spec


def attention_case(key_dim: int, value_dim: int):
    g = torch.Generator().manual_seed(key_dim * 31 + value_dim)
    q = torch.randn(2, 4, 5, key_dim, generator=g)
    k, v = torch.randn(2, 4, 9, key_dim, generator=g), torch.randn(2, 4, 9, value_dim, generator=g)
    mask = torch.rand(2, 1, 5, 9, generator=g) > 0.4
    mask[..., -5:] |= torch.eye(5, dtype=torch.bool)  # every query sees its own slot
    return q, k, v, mask


@pytest.mark.parametrize(("key_dim", "value_dim"), [(20, 10), (8, 12), (16, 16)])
@pytest.mark.parametrize("flex", [False, True])
def test_keys_and_values_of_different_widths_equal_sdpa(key_dim, value_dim, flex):
    q, k, v, mask = attention_case(key_dim, value_dim)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.3
    )  # [B, H, T, Dv]
    got, _ = tree_attention_forward(None, q, k, v, mask, scaling=0.3, flex=flex)  # [B, T, H, Dv]
    assert got.shape == (2, 5, 4, value_dim)
    assert_rounding_close(got.transpose(1, 2), want, key_dim + 9)  # PARITY in fp32: scores and weighted sum


def tree_step_logits(target) -> torch.Tensor:
    tree = parse_tree_spec("static:binary-3")
    cache = target.new_cache(1, 32)
    target.forward(torch.tensor([[7, 8, 9, 10, 11]]), cache)
    positions = 5 + torch.tensor(tree.depths)[None]
    step = torch.arange(20, 20 + tree.size)[None]
    return target.logits(target.forward(step, cache, positions, tree_mask=ancestor_mask(tree)).hidden)


@pytest.mark.parametrize("backend", ["triton", "flex"])
def test_mla_target_with_kernel_attention_equals_sdpa(monkeypatch, backend):
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
        assert kernels.use_triton(torch.device("cpu")), (
            "TRITON_INTERPRET=1 should make the kernels run on CPU"
        )
    target = Target(tiny_deepseek(), tiny_tokenizer(), "tiny-deepseek")
    want = tree_step_logits(target)
    calls = []
    name = {"triton": "tree_attention", "flex": "tree_attention_flex"}[backend]
    real = getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *a: calls.append(a[2].shape[-1]) or real(*a))
    use_kernel_attention(target, backend)
    try:
        got = tree_step_logits(target)
    finally:
        use_kernel_attention(target, False)
    c = target.config
    assert calls == [c.qk_nope_head_dim + c.qk_rope_head_dim] * target.num_layers  # values padded to keys
    assert_rounding_close(got, want, mla_sums(target.config))  # PARITY in fp32 (tests/tolerances.py)
