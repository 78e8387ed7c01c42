"""The target adapter against transformers' own forward, on tiny random models of each supported family."""

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_rounding_close

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, path_to, position_ids

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


def assert_close(got, expected):
    """PARITY with transformers in fp32 (tests/tolerances.py): rounding of the tiny target's longest chain
    of sums at the logits' scale (they reach |80|: atol ~2e-2; a wrong mask or position moves logits by
    about their std, ~20)."""
    assert_rounding_close(got, expected, TINY_TARGET_SUMS)


@pytest.fixture(scope="module", params=FAMILIES)
def target(request):
    return Target(tiny_model(request.param), tiny_tokenizer(), f"tiny-{request.param}")


def hf_logits(target, ids):  # ids [1, T] -> [T, V]
    with torch.no_grad():
        return target.model(ids).logits[0].float()


def test_prefill_logits_and_captured_layers_match_transformers(target):
    ids = torch.randint(6, 128, (2, 9))
    out = target.forward(ids, target.new_cache(2, 16), capture_layers=(0, 1, 2))
    with torch.no_grad():
        ref = target.model(ids, output_hidden_states=True)
    assert_close(target.logits(out.hidden), ref.logits.float())
    # Our layer i is transformers' hidden_states[i + 1] (index 0 is the embedding output); transformers
    # applies the final norm to its last entry, we never do.
    for layer in (0, 1):
        assert_close(out.aux[layer], ref.hidden_states[layer + 1])
    assert_close(target.final_norm(out.aux[2]), ref.hidden_states[3])
    short = target.forward(ids, target.new_cache(2, 16), num_layers=2)
    assert_close(short.hidden, ref.hidden_states[2])


def test_chunked_prefill_and_decode_match_one_forward(target):
    ids = torch.randint(6, 128, (1, 12))
    cache = target.new_cache(1, 4)  # small on purpose: the cache must grow
    first = target.forward(ids[:, :5], cache)
    second = target.forward(ids[:, 5:11], cache)
    third = target.forward(ids[:, 11:], cache)
    hidden = torch.cat([first.hidden, second.hidden, third.hidden], dim=1)
    assert_close(target.logits(hidden)[0], hf_logits(target, ids))
    assert cache.length == 12


def test_left_padded_row_equals_unpadded(target):
    ids = torch.randint(6, 128, (1, 7))
    padded = torch.cat([torch.ones(1, 3, dtype=torch.long), ids], dim=1)
    valid = torch.tensor([[False] * 3 + [True] * 7])
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    cache = target.new_cache(1, 16)
    out = target.forward(padded, cache, positions, token_valid=valid)
    assert_close(target.logits(out.hidden[0, 3:]), hf_logits(target, ids))
    step = target.forward(torch.tensor([[9]]), cache, torch.tensor([[7]]))
    full = hf_logits(target, torch.cat([ids, torch.tensor([[9]])], dim=1))[-1]
    assert_close(target.logits(step.hidden[0, -1]), full)


# A root (the last committed token) and 5 drafted nodes: root -> 1 -> (2, 3), 2 -> 4, 3 -> 5.
TREE = Tree((-1, 0, 1, 1, 2, 3))


def test_tree_verification_equals_causal_forward_per_path(target):
    prefix = torch.randint(6, 128, (1, 6))
    nodes = torch.randint(6, 128, (1, TREE.size))
    cache = target.new_cache(1, 32)
    target.forward(prefix, cache)
    positions = position_ids(TREE, prefix_len=6)[None]  # [1, N]
    out = target.forward(nodes, cache, positions, tree_mask=ancestor_mask(TREE))
    tree_logits = target.logits(out.hidden[0])  # [N, V]
    for node in range(TREE.size):
        seq = torch.cat([prefix, nodes[:, path_to(TREE, node)]], dim=1)
        assert_close(tree_logits[node], hf_logits(target, seq)[-1])

    # Accept the path 0 -> 1 -> 3 -> 5: compact the cache, then continue without recomputing anything.
    accepted = path_to(TREE, 5)
    cache.compact(start=6, keep=torch.tensor([[6 + i for i in accepted]]))
    assert cache.length == 6 + len(accepted)
    step = target.forward(torch.tensor([[11]]), cache, torch.tensor([[6 + len(accepted)]]))
    seq = torch.cat([prefix, nodes[:, accepted], torch.tensor([[11]])], dim=1)
    assert_close(target.logits(step.hidden[0, -1]), hf_logits(target, seq)[-1])


def test_unsupported_architecture_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(BadInputError, match="model_type"):
        Target(model, tiny_tokenizer(), "gpt2")


def test_capture_layer_out_of_range(target):
    with pytest.raises(BadInputError, match="capture_layers"):
        target.forward(torch.tensor([[7, 8]]), target.new_cache(1, 4), capture_layers=(target.num_layers,))
