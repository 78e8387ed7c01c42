"""Attention masks over a padded cache and the KV cache's crop / compact / grow."""

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.masks import attention_mask, is_plain_causal


def test_mask_hides_padding_and_future():
    valid = torch.tensor([[False, True, True, True], [True, True, True, True]])  # row 0 left-padded
    mask = attention_mask(valid, new_tokens=2)  # slots 2, 3 are new
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].tolist() == [[False, True, True, False], [False, True, True, True]]
    assert mask[1, 0].tolist() == [[True, True, True, False], [True, True, True, True]]


def test_padded_query_still_sees_itself():
    valid = torch.tensor([[False, False, True]])
    mask = attention_mask(valid, new_tokens=3)[0, 0]
    assert mask.any(dim=-1).all()  # no all-False row (SDPA would return NaN)
    assert mask.tolist() == [[True, False, False], [False, True, False], [False, False, True]]


def test_tree_mask_block():
    valid = torch.ones(1, 5, dtype=torch.bool)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2's parent is 0
    mask = attention_mask(valid, 3, tree)[0, 0]
    assert mask[:, :2].all()  # every node sees the prefix
    assert mask[:, 2:].tolist() == tree.tolist()


def test_plain_causal_detection():
    assert is_plain_causal(6, 6, None, False) and is_plain_causal(6, 1, None, False)
    assert not is_plain_causal(6, 3, None, False)  # chunk after a prefix: needs an explicit mask
    assert not is_plain_causal(6, 6, torch.ones(6, 6, dtype=torch.bool), False)
    assert not is_plain_causal(6, 1, None, True)  # padding or holes


def test_cache_knows_its_holes_without_reading_the_device():
    """KVCache.holes: False while every write is dense and compactions keep rows even; a padded write, a
    ragged compaction or ragged prefixes set it (and it matches the valid mask's truth)."""
    dense = make_cache(8)
    dense.reserve(3, torch.ones(2, 3, dtype=torch.bool), dense=True)
    dense.commit()
    dense.keep_rows(1, [[1], [2]])  # one slot each: no row padded
    dense.keep_prefixes(0, [2, 2])
    assert not dense.holes and bool(dense.valid[:, : dense.length].all())
    for make_holes in (
        lambda c: c.reserve(1, torch.tensor([[True], [False]])),
        lambda c: c.keep_rows(1, [[1, 2], [2]]),
        lambda c: c.keep_prefixes(0, [3, 1]),
    ):
        cache = make_cache(8)
        cache.reserve(3, torch.ones(2, 3, dtype=torch.bool), dense=True)
        cache.commit()
        make_holes(cache)
        cache.commit()
        assert cache.holes and not bool(cache.valid[:, : cache.length].all())


def make_cache(capacity=4):
    return KVCache(
        num_layers=2,
        batch=2,
        num_kv_heads=1,
        head_dim=2,
        capacity=capacity,
        dtype=torch.float32,
        device="cpu",
    )


def write(cache, values):  # values [B, T]: one forward writing those numbers as K and V
    kv = torch.tensor(values, dtype=torch.float32)[:, None, :, None].expand(-1, 1, -1, 2)
    cache.reserve(kv.shape[2], torch.ones(kv.shape[0], kv.shape[2], dtype=torch.bool))
    for layer in range(2):
        k, v = cache.update(kv, kv + 100, layer)
    cache.commit()
    return k


def test_update_grows_and_returns_full_history():
    cache = make_cache(capacity=2)
    write(cache, [[1, 2], [3, 4]])
    k = write(cache, [[5, 6, 7], [8, 9, 10]])  # exceeds capacity: doubles
    assert cache.length == 5 and cache.capacity >= 5
    assert k[:, 0, :, 0].tolist() == [[1, 2, 5, 6, 7], [3, 4, 8, 9, 10]]
    assert cache.values[1][0, 0, :5, 0].tolist() == [101, 102, 105, 106, 107]


def test_crop_and_compact():
    cache = make_cache(capacity=8)
    write(cache, [[1, 2], [3, 4]])
    write(cache, [[10, 11, 12, 13], [20, 21, 22, 23]])  # a "tree" of 4 nodes after a 2-slot prefix
    cache.compact(start=2, keep=torch.tensor([[2, 4], [3, 5]]))  # accepted path per row
    assert cache.length == 4
    assert cache.keys[0][:, 0, :4, 0].tolist() == [[1, 2, 10, 12], [3, 4, 21, 23]]
    assert cache.values[1][:, 0, :4, 0].tolist() == [[101, 102, 110, 112], [103, 104, 121, 123]]
    assert not cache.valid[:, 4:].any() and cache.valid[:, :4].all()
    cache.crop(3)
    assert cache.length == 3 and not cache.valid[:, 3:].any()


def test_keep_prefixes_equals_compacting_a_prefix():
    """Chains accept a prefix of their slots: keeping it in place must leave what compact would."""
    moved, kept = make_cache(capacity=8), make_cache(capacity=8)
    for cache in (moved, kept):
        write(cache, [[1, 2], [3, 4]])
        write(cache, [[10, 11, 12, 13], [20, 21, 22, 23]])
    lengths = [3, 1]  # row 0 keeps root + 2 accepted, row 1 only its root
    moved.compact(2, torch.tensor([[2, 3, 4], [2, 2, 2]]), torch.tensor([[1, 1, 1], [1, 0, 0]]).bool())
    kept.keep_prefixes(2, lengths)
    assert kept.length == moved.length == 5
    assert torch.equal(kept.valid, moved.valid)
    valid = kept.valid[:, :5]
    for a, b in zip(kept.keys + kept.values, moved.keys + moved.values):
        assert torch.equal(a[:, :, :5][valid[:, None, :].expand(-1, a.shape[1], -1)],
                           b[:, :, :5][valid[:, None, :].expand(-1, b.shape[1], -1)])  # fmt: skip
