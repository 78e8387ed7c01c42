"""Tree acceptance (SpecInfer's multi-step rule, batched): the torch references against the runtime's
proven per-row walk (runtime/verify/acceptance.py) with the same uniforms, against the chain references on
chains, and the Triton kernels (interpreter, fp32) against the references."""

import os
import subprocess
import sys

import pytest
import torch

from draftsmith import kernels
from draftsmith.kernels.compile_check import CONSTEXPRS
from draftsmith.kernels.reference import (
    chain_accept_greedy_ref,
    chain_accept_ref,
    inverse_cdf,
    tree_accept_greedy_ref,
    tree_accept_ref,
)
from draftsmith.runtime.verify.acceptance import accept_greedy, accept_sampled, children_lists


def random_parents(nodes: int, g: torch.Generator) -> list[int]:
    """A random tree in topological order: node c hangs under one of the nodes before it, favouring the
    recent ones so trees get both depth and siblings."""
    parents = [-1]
    for c in range(1, nodes):
        low = max(0, c - 3)
        parents.append(int(torch.randint(low, c, (), generator=g)))
    return parents


def tree_case(batch=4, nodes=9, vocab=31, seed=0, agree=0.7, pad=True, placeholder=True):
    """Per row a random tree padded to `nodes` (parent -1 past its size), p and q per node, tokens drawn
    from q_c (mixed with p at the parent so some are accepted), coins [B, N] and draws [B]."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for b in range(batch):
        size = nodes - (b % 3 if pad else 0)
        parents[b, :size] = torch.tensor(random_parents(size, g))
    p = torch.softmax(2 * torch.randn(batch, nodes, vocab, generator=g), -1)
    q = torch.softmax(2 * torch.randn(batch, nodes, vocab, generator=g), -1)
    at_parent = p[torch.arange(batch)[:, None], parents.clamp(min=0)]  # [B, N, V]
    q = agree * at_parent + (1 - agree) * q
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, nodes)
    if placeholder:
        tokens[0, -1] = -1  # a placeholder is never accepted
    return parents, tokens, p, q, torch.rand(batch, nodes, generator=g), torch.rand(batch, generator=g)


def node_coin(parents: list[int], tokens: list[int], coins: list[float], vocab: int):
    """coin(prob) for acceptance.accept_sampled that reads coins[c] for the child c it is testing: it
    follows the walk (children in id order, placeholders skipped, descend on acceptance)."""
    children = children_lists(parents)
    state = {"node": 0, "next": 0}

    def coin(prob: torch.Tensor) -> bool:
        kids = [c for c in children[state["node"]] if 0 <= tokens[c] < vocab]
        child = kids[state["next"]]
        take = coins[child] < float(prob)
        state.update(node=child, next=0) if take else state.update(next=state["next"] + 1)
        return take

    return coin


def runtime_verdict(parents, tokens, p, q, coins, draws, b):
    """The runtime's rule on row b (its real nodes only), driven by the same uniforms."""
    size = int((parents[b] >= 0).sum()) + 1
    par, tok = parents[b, :size].tolist(), tokens[b, :size].tolist()
    vocab = p.shape[-1]
    return accept_sampled(
        par,
        tok,
        p[b, :size].double(),
        None if q is None else q[b, :size].double(),
        node_coin(par, tok, coins[b].tolist(), vocab),
        lambda dist: int(inverse_cdf(dist[None], draws[b : b + 1].double())[0]),
    )


def assert_same_as_runtime(case, out):
    parents, tokens, p, q, coins, draws = case
    path, num, nxt = out
    for b in range(parents.shape[0]):
        verdict = runtime_verdict(parents, tokens, p, q, coins, draws, b)
        assert path[b, : num[b]].tolist() == verdict.accepted
        assert (path[b, num[b] :] == -1).all()
        assert int(nxt[b]) == verdict.next_token


# ---- references against the runtime ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_tree_ref_equals_the_runtimes_rejection_rule(seed):
    case = tree_case(seed=seed)
    out = tree_accept_ref(*case)
    assert_same_as_runtime(case, out)


@pytest.mark.parametrize("seed", range(12))
def test_tree_ref_with_point_masses_equals_the_runtimes_rule(seed):
    parents, tokens, p, _, coins, draws = tree_case(seed=seed)
    case = (parents, tokens, p, None, coins, draws)
    assert_same_as_runtime(case, tree_accept_ref(*case))


def test_tree_cases_exercise_acceptance_rejection_and_siblings():
    """The cases above are not vacuous: over the seeds, paths of several lengths occur, and rejected
    first children are followed by accepted siblings."""
    lengths, sibling_wins = set(), 0
    for seed in range(12):
        parents, tokens, p, q, coins, draws = case = tree_case(seed=seed)
        path, num, _ = tree_accept_ref(*case)
        lengths |= set(num.tolist())
        for b in range(parents.shape[0]):
            children = children_lists(parents[b].tolist())
            steps = [0, *path[b, : num[b]].tolist()]
            sibling_wins += sum(child != children[parent][0] for parent, child in zip(steps, steps[1:]))
    assert {0, 1, 2} <= lengths and sibling_wins > 0


@pytest.mark.parametrize("seed", range(5))
def test_greedy_tree_ref_equals_the_runtimes_rule(seed):
    parents, tokens, p, _, _, _ = tree_case(seed=seed, agree=1.0)
    logits = p.log()
    tokens[:, 1:] = torch.where(
        torch.rand(tokens[:, 1:].shape) < 0.5, logits.argmax(-1)[:, :1], tokens[:, 1:]
    )
    path, num, nxt = tree_accept_greedy_ref(parents, tokens, logits)
    for b in range(parents.shape[0]):
        size = int((parents[b] >= 0).sum()) + 1
        verdict = accept_greedy(parents[b, :size].tolist(), tokens[b, :size].tolist(), logits[b, :size])
        assert path[b, : num[b]].tolist() == verdict.accepted and int(nxt[b]) == verdict.next_token


@pytest.mark.parametrize("seed", range(5))
def test_tree_refs_equal_the_chain_refs_on_chains(seed):
    """A chain is a tree: with the same uniforms (coins shifted by the root's) both rules agree."""
    g = torch.Generator().manual_seed(seed)
    batch, k, vocab = 6, 4, 23
    p = torch.softmax(2 * torch.randn(batch, k + 1, vocab, generator=g), -1)
    q = 0.6 * p[:, :k] + 0.4 * torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    drafted = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    coins, draws = torch.rand(batch, k + 1, generator=g), torch.rand(batch, generator=g)
    parents = torch.arange(-1, k).repeat(batch, 1)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), drafted], 1)
    q_nodes = torch.cat([torch.zeros(batch, 1, vocab), q], 1)
    _, num, nxt = tree_accept_ref(parents, tokens, p, q_nodes, coins, draws)
    assert_outputs_equal((num, nxt), chain_accept_ref(p, q, drafted, coins[:, 1:], draws))
    _, num, nxt = tree_accept_greedy_ref(parents, tokens, p.log())
    want = chain_accept_greedy_ref(p.log(), drafted)
    assert torch.equal(num, want[0]) and torch.equal(nxt, want[1])


# ---- Triton kernels (interpreter) against the references --------------------------------------------


@pytest.fixture
def triton_mode(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    assert kernels.use_triton(torch.device("cpu")), "TRITON_INTERPRET=1 should make the kernels run on CPU"


def assert_outputs_equal(got, want):
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize(("batch", "nodes", "vocab", "seed"), [(1, 2, 7, 0), (4, 9, 31, 1), (3, 12, 2500, 2)])
@pytest.mark.parametrize("point", [False, True])
def test_tree_kernel_equals_reference(triton_mode, batch, nodes, vocab, seed, point):
    parents, tokens, p, q, coins, draws = tree_case(batch, nodes, vocab, seed, pad=batch > 1)
    case = (parents, tokens, p, None if point else q, coins, draws)
    assert_outputs_equal(kernels.tree_accept(*case), tree_accept_ref(*case))


@pytest.mark.parametrize(("batch", "nodes", "vocab"), [(1, 2, 5), (5, 10, 3000)])
def test_greedy_tree_kernel_equals_reference(triton_mode, batch, nodes, vocab):
    parents, tokens, p, _, _, _ = tree_case(batch, nodes, vocab, seed=vocab, agree=1.0)
    logits = p.log()
    tokens[:, 1:] = logits.argmax(-1)[:, :1]  # every child of the root matches: the first one wins
    assert_outputs_equal(
        kernels.tree_accept_greedy(parents, tokens, logits), tree_accept_greedy_ref(parents, tokens, logits)
    )


def test_tree_inputs_are_validated():
    parents, tokens, p, q, coins, draws = tree_case()
    with pytest.raises(ValueError, match="parents"):
        kernels.tree_accept(parents[:, 1:], tokens, p, q, coins, draws)
    with pytest.raises(ValueError, match="draft_probs"):
        kernels.tree_accept(parents, tokens, p, q[:, 1:], coins, draws)
    with pytest.raises(ValueError, match="coins"):
        kernels.tree_accept(parents, tokens, p, q, coins[:, 1:], draws)
    with pytest.raises(ValueError, match="target_probs"):
        kernels.tree_accept(parents, tokens, p.half(), q, coins, draws)
    with pytest.raises(ValueError, match="tokens"):
        kernels.tree_accept_greedy(parents, tokens.float(), p)


# ---- on a GPU: compiled kernels at real shapes (scripts/gpu_check.sh runs these) ---------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("batch", "nodes", "vocab"), [(1, 64, 128256), (16, 16, 49152)])
def test_tree_kernels_on_cuda_at_real_shapes(monkeypatch, batch, nodes, vocab):
    monkeypatch.setenv("DRAFTSMITH_KERNELS", "triton")
    case = [t.cuda() for t in tree_case(batch, nodes, vocab, seed=batch)]
    path, num, nxt = kernels.tree_accept(*case)
    ref_path, ref_num, ref_nxt = tree_accept_ref(*case)
    assert torch.equal(num, ref_num) and torch.equal(path, ref_path)
    # blocked and torch sums may differ in the last bits: a drawn token may differ only where the
    # threshold falls within rounding of a boundary (A11's near-tie rule)
    assert (nxt != ref_nxt).float().mean() <= 1 / batch
    parents, tokens, p = case[:3]
    logits = p.log().to(torch.bfloat16)
    assert_outputs_equal(
        kernels.tree_accept_greedy(parents, tokens, logits), tree_accept_greedy_ref(parents, tokens, logits)
    )


# ---- ahead-of-time compilation for Hopper (no GPU needed) --------------------------------------------

COMPILE_ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
    "TRITON_DEFAULT_FP_FUSION": "1"
}


def test_every_kernel_compiles_for_sm90_within_shared_memory():
    pytest.importorskip("triton")
    run = subprocess.run(
        [sys.executable, "-m", "draftsmith.kernels.compile_check", "--arch", "90"],
        capture_output=True, text=True, env=COMPILE_ENV, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    compiled = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("sm_90")}
    assert compiled == set(CONSTEXPRS) and len(run.stdout.splitlines()) == 2 * len(CONSTEXPRS)


def test_compile_check_flags_a_block_size_over_the_shared_memory_limit():
    """Negative control: float32 attention tiles of 64 x 64 at head dim 128 need more shared memory than
    an A100 block has; the check must fail on them."""
    pytest.importorskip("triton")
    script = (
        "import sys; from draftsmith.kernels import compile_check as c, triton_kernels as t\n"
        "c.CONSTEXPRS = {'_tree_attention_kernel': c.CONSTEXPRS['_tree_attention_kernel']}\n"
        "t.attention_blocks = lambda nodes, dim, dtype: (64, 64, 128)\n"
        "sys.exit(c.main(['--arch', '80']))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=COMPILE_ENV, timeout=600
    )
    assert run.returncode == 1 and "fp32" in run.stderr and "would fail" in run.stderr, run.stderr[-2000:]
