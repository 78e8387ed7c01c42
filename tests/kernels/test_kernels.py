"""draftsmith.kernels: the torch references against the runtime's proven rules and cache, the Triton
kernels (in Triton's interpreter, fp32, small shapes) against the references, and the dispatch switch."""

import logging

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_rounding_close, rounding_atol

from draftsmith import kernels
from draftsmith.kernels.reference import (
    chain_accept_greedy_ref,
    chain_accept_ref,
    inverse_cdf,
    kv_compact_ref,
    tree_attention_ref,
)
from draftsmith.runtime.core.kernel_attention import use_kernel_attention
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.core.static_forward import static_session
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.acceptance import accept_greedy, accept_sampled
from draftsmith.runtime.verify.tree import ancestor_mask, parse_tree_spec


def chain_case(batch=5, k=3, vocab=37, seed=0, agree=0.6):
    """p [B, K+1, V], q [B, K, V], tokens drawn from q (so some are accepted), coins, draws."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(batch, k + 1, vocab, generator=g), -1)
    q = torch.softmax(2 * torch.randn(batch, k, vocab, generator=g), -1)
    q = agree * p[:, :k] + (1 - agree) * q  # drafts that often agree with the target
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    return p, q, tokens, torch.rand(batch, k, generator=g), torch.rand(batch, generator=g)


# ---- references against the runtime ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_chain_ref_equals_the_runtimes_rejection_rule(seed):
    p, q, tokens, coins, draws = chain_case(seed=seed)
    num, nxt = chain_accept_ref(p, q, tokens, coins, draws)
    k = tokens.shape[1]
    for b in range(tokens.shape[0]):
        coin_values = iter(coins[b].tolist())
        verdict = accept_sampled(
            list(range(-1, k)),
            [0, *tokens[b].tolist()],
            p[b],
            torch.cat([q.new_zeros(1, q.shape[-1]), q[b]]),  # node 0 (the root) was not drafted
            lambda prob, it=coin_values: next(it) < float(prob),
            lambda dist, b=b: int(inverse_cdf(dist[None], draws[b : b + 1])[0]),
        )
        assert (len(verdict.accepted), verdict.next_token) == (int(num[b]), int(nxt[b]))


@pytest.mark.parametrize("seed", range(5))
def test_greedy_ref_equals_the_runtimes_rule(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 4, 29, generator=g)
    tokens = logits[:, :3].argmax(-1)
    tokens[torch.arange(6), torch.arange(6) % 3] = (
        0  # each row breaks its chain somewhere (or not, if 0 wins)
    )
    num, nxt = chain_accept_greedy_ref(logits, tokens)
    for b in range(6):
        verdict = accept_greedy([-1, 0, 1, 2], [5, *tokens[b].tolist()], logits[b])
        assert (len(verdict.accepted), verdict.next_token) == (int(num[b]), int(nxt[b]))


def test_kv_compact_ref_equals_the_caches_compaction():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(2, 3, 2, 4, 16, torch.float32, "cpu")
    cache.reserve(10, torch.ones(3, 10, dtype=torch.bool))
    for layer in range(2):
        cache.update(torch.randn(3, 2, 10, 4, generator=g), torch.randn(3, 2, 10, 4, generator=g), layer)
    cache.commit()
    keys = [t.clone() for t in cache.keys]
    keep = torch.tensor([[5, 6, 7], [5, 8, 9], [6, 7, 9]])  # overlapping moves: slot 6 -> 5 then 7 -> 6
    cache.compact(5, keep)
    for layer in range(2):
        kv_compact_ref(keys[layer], 5, keep)
        assert torch.equal(keys[layer][:, :, :8], cache.keys[layer][:, :, :8])


# ---- Triton kernels (interpreter) against the references --------------------------------------------


@pytest.fixture
def triton_mode(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    assert kernels.use_triton(torch.device("cpu")), "TRITON_INTERPRET=1 should make the kernels run on CPU"


@pytest.mark.parametrize(("batch", "k", "vocab", "seed"), [(1, 1, 7, 0), (4, 3, 37, 1), (3, 5, 2500, 2)])
def test_chain_kernel_equals_reference(triton_mode, batch, k, vocab, seed):
    case = chain_case(batch, k, vocab, seed, agree=0.3)
    got = kernels.chain_accept(*case)
    want = chain_accept_ref(*case)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert 0 < int(want[0].sum()) < batch * k or batch == 1  # both outcomes exercised


@pytest.mark.parametrize(("batch", "k", "vocab"), [(1, 1, 5), (5, 4, 3000)])
def test_greedy_kernel_equals_reference(triton_mode, batch, k, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, k + 1, vocab, generator=g)
    logits[0, 0, 3] = logits[0, 0, 4] = logits[0, 0].max() + 1  # a tie: the first index wins
    tokens = logits[:, :k].argmax(-1)
    tokens[1:, -1] += 1  # rows > 0 reject their last token
    got, want = kernels.chain_accept_greedy(logits, tokens), chain_accept_greedy_ref(logits, tokens)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("keep", [[[5, 6, 7], [5, 8, 9]], [[6, 7, 8], [9, 10, 11]], [[5], [11]]])
def test_kv_compact_kernel_equals_reference(triton_mode, keep):
    cache = torch.randn(2, 3, 12, 20)
    want = cache.clone()
    kernels.kv_compact(cache, 5, torch.tensor(keep))
    kv_compact_ref(want, 5, torch.tensor(keep))
    assert torch.equal(cache, want)


def attention_case(batch=2, hq=4, hkv=2, prefix=37, dim=16, tree="static:binary-3", seed=0):
    """Tree nodes over a cache with holes: q, k, v and the runtime's own mask."""
    g = torch.Generator().manual_seed(seed)
    nodes = parse_tree_spec(tree).size
    slots = prefix + nodes
    q = torch.randn(batch, hq, nodes, dim, generator=g)
    k, v = (torch.randn(batch, hkv, slots, dim, generator=g) for _ in range(2))
    valid = torch.rand(batch, slots, generator=g) > 0.2  # padding and holes
    mask = attention_mask(valid, nodes, ancestor_mask(parse_tree_spec(tree)))
    return q, k, v, mask, dim**-0.5


def assert_attention_close(got, want, q, k, dtype=torch.float32):
    """PARITY of an attention kernel with the reference (tests/tolerances.py): scores sum over head_dim,
    the softmax and the weighted values over the slots, so dim + 2 * slots roundings of `dtype` at the
    outputs' scale (v ~ N(0, 1), |out| < ~3) plus one rounding of `dtype` for the output itself."""
    sums = q.shape[-1] + 2 * k.shape[-2] + 1
    assert_rounding_close(got.float(), want.float(), sums, dtype)


def test_tree_attention_ref_equals_the_models_gqa_attention():
    q, k, v, mask, scale = attention_case()
    got = tree_attention_ref(q, k, v, mask, scale)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            scores = q[b, h] @ k[b, h // 2].T * scale
            probs = torch.softmax(scores.masked_fill(~mask[b, 0], float("-inf")), dim=-1)
            assert_attention_close(got[b, h], probs @ v[b, h // 2], q, k)


@pytest.mark.parametrize(
    ("batch", "hq", "hkv", "prefix", "dim", "tree"),
    [(1, 2, 2, 5, 16, "chain:1"), (2, 4, 2, 100, 32, "static:binary-3"), (3, 6, 2, 70, 24, "chain:20")],
)
def test_tree_attention_kernel_equals_reference(triton_mode, batch, hq, hkv, prefix, dim, tree):
    case = attention_case(batch, hq, hkv, prefix, dim, tree)
    assert_attention_close(kernels.tree_attention(*case), tree_attention_ref(*case), case[0], case[1])


@pytest.mark.parametrize(
    ("batch", "hq", "hkv", "prefix", "dim", "tree"),
    [(1, 2, 2, 5, 16, "chain:1"), (2, 4, 2, 100, 32, "static:binary-3"), (3, 6, 2, 200, 24, "chain:20")],
)
def test_tree_attention_flex_equals_reference(batch, hq, hkv, prefix, dim, tree):
    """FlexAttention's eager path with the dense mask as its mask_mod; 200 + 21 slots span two KV blocks."""
    case = attention_case(batch, hq, hkv, prefix, dim, tree)
    assert_attention_close(kernels.tree_attention_flex(*case), tree_attention_ref(*case), case[0], case[1])


def test_flex_block_mask_tiles_and_full_tiles():
    """dense_block_mask's tiles (built by reductions) cover exactly the tiles create_block_mask's do (the
    mask_mod evaluated everywhere); the tiles it calls full (the kernel skips their mask_mod) are those the
    mask fills for every real query row: here a 300-token prefix without holes in row 0, and none in row 1,
    whose holes (100..259) empty one tile and cut another. The attention over it equals the reference."""
    from torch.nn.attention.flex_attention import create_block_mask

    from draftsmith.kernels.flex import dense_block_mask

    q, k, v, mask, scale = attention_case(batch=2, prefix=300, tree="static:binary-3")
    mask[:, :, :, :300] = True
    mask[1, :, :, 100:260] = False
    ours = dense_block_mask(mask)
    theirs = create_block_mask(
        lambda b, h, i, j: mask[b, 0, i, j], 2, None, mask.shape[2], mask.shape[3], "cpu"
    )
    assert torch.equal(ours.kv_num_blocks + ours.full_kv_num_blocks, theirs.kv_num_blocks)  # no full: T < 128
    assert ours.full_kv_num_blocks.flatten().tolist() == [2, 0]
    assert ours.kv_num_blocks.flatten().tolist() == [1, 2]
    assert ours.full_kv_indices[0, 0, 0, :2].tolist() == [0, 1]
    assert ours.kv_indices[1, 0, 0, :2].tolist() == [0, 2]  # tile 1 is all holes: skipped
    got = kernels.tree_attention_flex(q, k, v, mask, scale)
    assert_attention_close(got, tree_attention_ref(q, k, v, mask, scale), q, k)


def test_tree_attention_flex_reads_the_tree_mask():
    """Negative control: the same nodes under a plain causal mask give other outputs, so the equality above
    needs the tree's ancestor relation to reach FlexAttention's mask_mod."""
    q, k, v, mask, scale = attention_case(tree="static:binary-3")
    nodes = q.shape[2]
    causal = mask.clone()
    causal[..., -nodes:] = torch.ones(nodes, nodes, dtype=torch.bool).tril()
    assert not torch.equal(causal, mask)
    got = kernels.tree_attention_flex(q, k, v, causal, scale)
    assert (got - tree_attention_ref(q, k, v, mask, scale)).abs().max() > 1e-2


@pytest.mark.slow
def test_tree_attention_flex_compiled_on_cpu_equals_reference():
    """The generated kernel (torch.compile, inductor's CPU backend; CUDA uses Triton), not the eager path."""
    from draftsmith.kernels.flex import tree_attention_flex

    case = attention_case(2, 4, 2, 300, 32, "static:binary-3")
    case[3][0, :, :, :256] = True  # row 0: two full tiles, whose mask_mod the kernel skips
    assert_attention_close(
        tree_attention_flex(*case, compiled=True), tree_attention_ref(*case), case[0], case[1]
    )


# ---- dispatch and validation ------------------------------------------------------------------------


def test_forced_kernels_without_a_way_to_run_fall_back_with_one_line(monkeypatch, caplog):
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(kernels, "_warned", set())
    with caplog.at_level(logging.INFO, logger="draftsmith"):
        for _ in range(3):
            num, _ = kernels.chain_accept(*chain_case())
    assert num.shape == (5,)
    assert len([r for r in caplog.records if "using the torch references" in r.message]) == 1
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not kernels.use_triton(torch.device("cpu"))
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "cuda")
    with pytest.raises(ValueError, match="DRAFTSMITH_KERNELS"):
        kernels.use_triton(torch.device("cpu"))


def test_auto_runs_the_references_on_cuda_too(monkeypatch, caplog):
    """Issue 45 item 6: the default is the path CI runs (the torch references, on every device); the Triton
    kernels, which run in CI only under the interpreter, are an explicit choice that says what it is."""
    monkeypatch.delenv("DRAFTSMITH_KERNELS", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(kernels, "_triton_importable", lambda: True)
    monkeypatch.setattr(kernels, "_warned", set())
    cuda = torch.device("cuda")
    assert not kernels.use_triton(cuda)
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "auto")
    assert not kernels.use_triton(cuda)
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    with caplog.at_level(logging.INFO, logger="draftsmith"):
        assert kernels.use_triton(cuda) and kernels.use_triton(cuda)
    said = [r.message for r in caplog.records if "GPU-only" in r.message]
    assert len(said) == 1 and "Triton" in said[0], said


def test_inputs_are_validated():
    p, q, tokens, coins, draws = chain_case()
    with pytest.raises(ValueError, match="draft_probs"):
        kernels.chain_accept(p, q.double(), tokens, coins, draws)
    with pytest.raises(ValueError, match="shapes"):
        kernels.chain_accept(p, q[:, :2], tokens, coins, draws)
    with pytest.raises(ValueError, match="tokens"):
        kernels.chain_accept_greedy(p, tokens.float())
    with pytest.raises(ValueError, match="do not fit"):
        kernels.kv_compact(torch.zeros(2, 1, 8, 4), 6, torch.tensor([[6, 7, 8], [6, 7, 8]]))
    with pytest.raises(ValueError, match="expected a 4-d"):
        kernels.kv_compact(torch.zeros(8, 4), 0, torch.tensor([[0]]))
    q, k, v, mask, scale = attention_case()
    with pytest.raises(ValueError, match="mask"):
        kernels.tree_attention(q, k, v, mask[:, :, :, 1:], scale)
    with pytest.raises(ValueError, match="do not match"):
        kernels.tree_attention(q, k[:, :, :, :8], v[:, :, :, :8], mask, scale)
    with pytest.raises(ValueError, match="dtype"):
        kernels.tree_attention(q, k.double(), v, mask, scale)
    with pytest.raises(ValueError, match="mask"):
        kernels.tree_attention_flex(q, k, v, mask.float(), scale)


# ---- on a GPU: compiled kernels at real shapes (scripts/gpu_check.sh runs these) ---------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("batch", "k", "vocab"), [(1, 8, 128256), (16, 4, 49152)])
def test_chain_kernels_on_cuda_at_real_shapes(monkeypatch, batch, k, vocab):
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    p, q, tokens, coins, draws = (t.cuda() for t in chain_case(batch, k, vocab, seed=batch))
    num, nxt = kernels.chain_accept(p, q, tokens, coins, draws)
    ref_num, ref_nxt = chain_accept_ref(p, q, tokens, coins, draws)
    assert torch.equal(num, ref_num)
    # the draw is an inverse CDF: blocked and torch cumsums may differ in the last bits, so a token may
    # differ only where the threshold falls within rounding of a boundary (A11's near-tie rule)
    assert (nxt != ref_nxt).float().mean() <= 1 / batch
    logits = torch.randn(batch, k + 1, vocab, device="cuda", dtype=torch.bfloat16)
    greedy = kernels.chain_accept_greedy(logits, logits[:, :k].argmax(-1))
    assert all(
        torch.equal(a, b) for a, b in zip(greedy, chain_accept_greedy_ref(logits, logits[:, :k].argmax(-1)))
    )


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kv_compact_kernel_on_cuda_at_real_shapes(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    cache = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    keep = torch.sort(torch.randperm(64, device="cuda")[:16].repeat(8, 1) + 2000, dim=1).values
    want = cache.clone()
    kernels.kv_compact(cache, 2000, keep)
    kv_compact_ref(want, 2000, keep)
    assert torch.equal(cache, want)  # a copy: bit-exact in any dtype


def assert_low_precision_attention_close(got, want, dtype):
    """A bf16/fp16 kernel against the fp32 reference: its inputs are rounded to `dtype` once (q, k, v)
    and it accumulates in fp32 (as flash kernels do), so the error is the inputs' and output's rounding,
    a few units of `dtype` at the outputs' scale (|out| < 1 here: averages of 2000 N(0, 1) values), plus
    fp32's over head_dim + 2 * slots; 4 units of `dtype` bound the first (bf16 3.1e-2, fp16 3.9e-3)."""
    atol = rounding_atol(dtype, 4, 1.0) + rounding_atol(torch.float32, 128 + 2 * 2064, 1.0)
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=0)


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("batch", "nodes"), [(1, 64), (8, 16)])
def test_tree_attention_kernel_on_cuda_at_8b_shape(monkeypatch, dtype, batch, nodes):
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    tree = f"chain:{nodes - 1}"
    q, k, v, mask, scale = (
        t.cuda() if isinstance(t, torch.Tensor) else t for t in attention_case(batch, 32, 8, 2000, 128, tree)
    )
    want = tree_attention_ref(q, k, v, mask, scale)  # fp32
    got = kernels.tree_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask, scale)
    assert_low_precision_attention_close(got, want, dtype)


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("batch", "nodes"), [(1, 64), (8, 16)])
def test_tree_attention_flex_on_cuda_at_8b_shape(dtype, batch, nodes):
    q, k, v, mask, scale = (
        t.cuda() if isinstance(t, torch.Tensor) else t
        for t in attention_case(batch, 32, 8, 2000, 128, f"chain:{nodes - 1}")
    )
    mask[0, :, :, :2000] = True  # row 0: full tiles (their mask_mod skipped); the others have holes
    want = tree_attention_ref(q, k, v, mask, scale)  # fp32
    got = kernels.tree_attention_flex(q.to(dtype), k.to(dtype), v.to(dtype), mask, scale)  # compiled
    assert_low_precision_attention_close(got, want, dtype)


# ---- the kernel inside the target's layers (runtime/core/kernel_attention.py) -----------------------------


def tree_step_logits(target) -> torch.Tensor:
    """A prefill (no mask: SDPA whatever the switch says) then a tree step (a boolean mask) -> logits."""
    tree = parse_tree_spec("static:binary-3")
    prompt, step = torch.tensor([[7, 8, 9, 10, 11]]), torch.arange(20, 20 + tree.size)[None]
    positions = 5 + torch.tensor(tree.depths)[None]
    cache = target.new_cache(1, 32)
    target.forward(prompt, cache)
    return target.logits(target.forward(step, cache, positions, tree_mask=ancestor_mask(tree)).hidden)


@pytest.mark.parametrize("backend", ["triton", "flex"])
def test_target_forward_with_kernel_attention_equals_sdpa(request, monkeypatch, backend):
    """The tree step with the Triton kernel (interpreted) or FlexAttention (eager) in every layer gives the
    same logits as the target on SDPA; it ran once per layer; switching drops captured graphs."""
    if backend == "triton":
        request.getfixturevalue("triton_mode")
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    want = tree_step_logits(target)
    calls = []
    name = {"triton": "tree_attention", "flex": "tree_attention_flex"}[backend]
    real = getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *a: calls.append(1) or real(*a))
    static_session(target, 1, 16)  # graphs captured now would replay SDPA: switching must drop them
    use_kernel_attention(target, backend)
    assert not target.graph_sessions
    try:
        got = tree_step_logits(target)
    finally:
        use_kernel_attention(target, False)
    assert len(calls) == target.num_layers
    assert_rounding_close(got, want, TINY_TARGET_SUMS)  # PARITY in fp32 (tests/tolerances.py)


def test_unknown_attention_backend_is_a_clear_error():
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    with pytest.raises(ValueError, match="attention: got 'xformers', expected one of"):
        use_kernel_attention(target, "xformers")
