"""Shared machinery for the acceptance-rule tests (tests/runtime/test_acceptance_*.py).

A context-dependent toy language model (a random trigram table) and tree drafting in four modes; exact
float64 enumeration of draft outcomes and verifier branches (scripted coin/draw replay); chi-square with
vLLM MRV2's threshold; Monte-Carlo tree counts and the engine-free chain walk.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from draftsmith.runtime.verify.acceptance import Verdict, accept_sampled, generator_coin, generator_draw
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs

# ----------------------------------------------------------------------------------------------------
# Toy language model and drafting
# ----------------------------------------------------------------------------------------------------


class ToyLM:
    """p(next | last two tokens): a random trigram table, so a node's distribution depends on its path."""

    def __init__(self, table: np.ndarray):
        self.table = table  # [V, V, V] float64, rows sum to 1
        self.vocab = table.shape[-1]

    @classmethod
    def random(cls, vocab: int, seed: int, alpha: float = 1.0) -> ToyLM:
        rng = np.random.default_rng(seed)
        return cls(rng.dirichlet(np.full(vocab, alpha), size=(vocab, vocab)))

    def mixed(self, other: ToyLM, weight: float) -> ToyLM:
        """weight * self + (1 - weight) * other: a drafter close to, but different from, the target."""
        return ToyLM(weight * self.table + (1.0 - weight) * other.table)

    def probs(self, context: Sequence[int]) -> np.ndarray:
        return self.table[context[-2], context[-1]]

    def extend(self, law: dict[tuple, float], history: tuple, length: int) -> dict[tuple, float]:
        """Continue each sequence by sampling from this model up to `length` tokens: the joint law."""
        out: dict[tuple, float] = defaultdict(float)
        stack = list(law.items())
        while stack:
            seq, weight = stack.pop()
            if len(seq) >= length:
                out[seq[:length]] += weight
                continue
            for token, prob in enumerate(self.probs(history + seq)):
                stack.append((seq + (token,), weight * prob))
        return out

    def joint(self, history: tuple, length: int) -> dict[tuple, float]:
        return self.extend({(): 1.0}, history, length)


HISTORY = (2, 1)  # (an earlier token, the root token): the root's trigram context
CHAIN3 = [-1, 0, 1, 2]
BINARY2 = [-1, 0, 0, 1, 1, 2, 2]
STAR3 = [-1, 0, 0, 0]
RANDOM5 = [-1, 0, 0, 1, 3, 3]  # random_parents(5, seed=1): depth 3, branching <= 2
WIDE_SHALLOW = [-1, 0, 0, 0, 1, 1]  # 3 children at the root, 2 under the first: for A4b


def toy_pair(vocab: int, seed: int = 0) -> tuple[ToyLM, ToyLM]:
    """A target and a context-dependent drafter that is close to it but different."""
    target = ToyLM.random(vocab, seed)
    return target, target.mixed(ToyLM.random(vocab, seed + 100), 0.4)


def random_parents(n: int, seed: int, max_depth: int = 3, max_children: int = 3) -> list[int]:
    """A random topological tree of n drafted nodes under the root."""
    rng = np.random.default_rng(seed)
    parents, depth, kids = [-1], [0], [0]
    for node in range(1, n + 1):
        ok = [i for i in range(node) if depth[i] < max_depth and kids[i] < max_children]
        parent = int(rng.choice(ok))
        parents.append(parent)
        depth.append(depth[parent] + 1)
        kids[parent] += 1
        kids.append(0)
    return parents


def tree_depth(parents: Sequence[int]) -> int:
    depth = [0] * len(parents)
    for node in range(1, len(parents)):
        depth[node] = depth[parents[node]] + 1
    return max(depth)


def context(parents: Sequence[int], tokens: Sequence[int], node: int, history: tuple) -> tuple:
    """history (ending in the root token) followed by the drafted tokens on the path root -> node."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return history + tuple(reversed(path))


def draft_dist(parents, tokens, node: int, drafter: ToyLM, history: tuple, mode: str) -> np.ndarray:
    """q_i, the law of node's token given earlier nodes: 'iid' (and a chain) q; 'without' q with the
    earlier siblings' tokens masked out and renormalized; 'topk' is deterministic (see topk_token)."""
    parent = parents[node]
    q = drafter.probs(context(parents, tokens, parent, history)).copy()
    if mode == "without":
        q[[tokens[s] for s in range(1, node) if parents[s] == parent]] = 0.0
        q /= q.sum()
    return q


def topk_token(parents, tokens, node: int, drafter: ToyLM, history: tuple) -> int:
    """Deterministic children: the r-th sibling is the r-th most likely token of q at the parent."""
    parent = parents[node]
    rank = sum(1 for s in range(1, node) if parents[s] == parent)
    q = drafter.probs(context(parents, tokens, parent, history))
    return int(np.argsort(-q, kind="stable")[rank])


def draft_outcomes(parents, mode: str, drafter: ToyLM, history: tuple) -> list[tuple[float, list, list]]:
    """Every draft of the tree: (probability, tokens, q rows); q rows are None for 'topk'."""
    outcomes = [(1.0, [history[-1]], [None])]
    for node in range(1, len(parents)):
        grown = []
        for weight, tokens, rows in outcomes:
            if mode == "topk":
                grown.append((weight, tokens + [topk_token(parents, tokens, node, drafter, history)], rows))
                continue
            q = draft_dist(parents, tokens, node, drafter, history, mode)
            grown += [(weight * q[t], tokens + [t], rows + [q]) for t in range(len(q)) if q[t] > 0]
        outcomes = grown
    return outcomes


def inverse_cdf(q: np.ndarray, u: float) -> int:
    """The token whose CDF interval holds u; never a zero-probability token."""
    cdf = np.cumsum(q)
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def sample_draft(parents, mode: str, drafter: ToyLM, history: tuple, uniforms: np.ndarray):
    """One draft of the tree from the drafter's uniforms: (tokens, q rows)."""
    tokens, rows = [history[-1]], [None]
    for node in range(1, len(parents)):
        if mode == "topk":
            tokens.append(topk_token(parents, tokens, node, drafter, history))
            continue
        q = draft_dist(parents, tokens, node, drafter, history, mode)
        tokens.append(inverse_cdf(q, uniforms[node]))
        rows.append(q)
    return tokens, rows


def verifier_inputs(parents, tokens, rows, target: ToyLM, history: tuple):
    """target_probs [N, V] (p after every node) and draft_probs [N, V] or None, float64."""
    p = np.stack([target.probs(context(parents, tokens, n, history)) for n in range(len(parents))])
    if rows[-1] is None:  # point masses ('topk')
        return torch.from_numpy(p), None
    q = np.stack([np.full(target.vocab, 1.0 / target.vocab)] + rows[1:])  # the root row is unused
    return torch.from_numpy(p), torch.from_numpy(q)


def emitted(verdict: Verdict, tokens: Sequence[int]) -> tuple:
    return tuple(int(tokens[n]) for n in verdict.accepted) + (int(verdict.next_token),)


# ----------------------------------------------------------------------------------------------------
# Exact enumeration (A4a): replay the verifier with scripted decisions
# ----------------------------------------------------------------------------------------------------

Verifier = Callable[..., Verdict]  # same signature as accept_sampled


class _Branch(Exception):
    def __init__(self, options: list[tuple[object, float]]):
        self.options = options


def _scripted(script: tuple) -> tuple[Callable, Callable]:
    """coin/draw that replay `script`, then raise _Branch listing the next decision's outcomes."""
    pending = list(reversed(script))

    def coin(prob: torch.Tensor) -> bool:
        if pending:
            return pending.pop()
        p = float(prob)
        raise _Branch([(True, p), (False, 1.0 - p)])

    def draw(dist: torch.Tensor) -> int:
        if pending:
            return pending.pop()
        raise _Branch(list(enumerate(dist.tolist())))

    return coin, draw


def verifier_branches(run: Callable[[Callable, Callable], Verdict]) -> list[tuple[float, Verdict]]:
    """Every outcome of run(coin, draw) with its probability, by DFS over decision sequences."""
    results, stack = [], [((), 1.0)]
    while stack:
        script, weight = stack.pop()
        try:
            results.append((weight, run(*_scripted(script))))
        except _Branch as branch:
            stack += [(script + (d,), weight * w) for d, w in branch.options if w > 0]
    return results


def exact_law(parents, mode, target, drafter, history=HISTORY, verify: Verifier = accept_sampled):
    """The exact joint law of the first depth + 1 tokens (emitted, then continued with p)."""
    law: dict[tuple, float] = defaultdict(float)
    for weight, tokens, rows in draft_outcomes(parents, mode, drafter, history):
        p, q = verifier_inputs(parents, tokens, rows, target, history)
        for w, verdict in verifier_branches(partial(verify, parents, tokens, p, q)):
            law[emitted(verdict, tokens)] += weight * w
    return target.extend(law, history, tree_depth(parents) + 1)


def law_error(parents, mode, target, drafter, verify: Verifier = accept_sampled) -> float:
    got = exact_law(parents, mode, target, drafter, verify=verify)
    want = target.joint(HISTORY, tree_depth(parents) + 1)
    return max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want))


# ----------------------------------------------------------------------------------------------------
# Chi-square (vLLM MRV2 threshold)
# ----------------------------------------------------------------------------------------------------


def chi2_merged(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square after lumping bins with expected < 5 into one bin; returns (stat, df)."""
    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    big = expected >= 5
    obs, exp = list(observed[big]), list(expected[big])
    o_small, e_small = observed[~big].sum(), expected[~big].sum()
    if e_small >= 5:
        obs.append(o_small)
        exp.append(e_small)
    elif e_small > 0 or o_small > 0:  # too small to stand alone: fold into the smallest kept bin
        i = int(np.argmin(exp))
        obs[i] += o_small
        exp[i] += e_small
    obs, exp = np.array(obs), np.array(exp)
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def chi2_threshold(df: int) -> float:
    return df + 10 * math.sqrt(2 * df)


def chi2_excess(observed, expected) -> float:
    """stat / threshold: < 1 passes."""
    stat, df = chi2_merged(observed, expected)
    return stat / chi2_threshold(df)


# ----------------------------------------------------------------------------------------------------
# Monte-Carlo on trees (A4b)
# ----------------------------------------------------------------------------------------------------


def tree_counts(parents, mode, target, drafter, n: int, m: int, seed: int, verify=accept_sampled):
    """Counts [V**m] of the first m emitted tokens (continued with p when a cycle emits fewer)."""
    g_draft, g_ver = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    coin, draw = generator_coin(g_ver), generator_draw(g_ver)
    uniforms = torch.rand(n, len(parents), generator=g_draft, dtype=torch.float64).numpy()
    counts = np.zeros(target.vocab**m, dtype=np.int64)
    for i in range(n):
        tokens, rows = sample_draft(parents, mode, drafter, HISTORY, uniforms[i])
        p, q = verifier_inputs(parents, tokens, rows, target, HISTORY)
        seq = emitted(verify(parents, tokens, p, q, coin, draw), tokens)
        while len(seq) < m:
            seq += (draw(torch.from_numpy(target.probs(HISTORY + seq))),)
        counts[np.ravel_multi_index(seq[:m], (target.vocab,) * m)] += 1
    return counts


def joint_array(target: ToyLM, m: int) -> np.ndarray:
    law = target.joint(HISTORY, m)
    out = np.zeros(target.vocab**m)
    for seq, prob in law.items():
        out[np.ravel_multi_index(seq, (target.vocab,) * m)] = prob
    return out


# ----------------------------------------------------------------------------------------------------
# Engine-free chain walk (A3)
# ----------------------------------------------------------------------------------------------------


def torch_inverse_cdf(dist: torch.Tensor, u: float) -> int:
    cdf = dist.double().cumsum(0)
    return int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))


def chain_counts(p, q_draw, n, seed, *, q_seen=None, coin=None, noise="multinomial"):
    """n chain cycles: drafts from q_draw, verified against p [K+1, V] with draft_probs q_seen [K, V].
    noise: 'multinomial' (independent generators), or inverse-CDF draws where the verifier's draw uses a
    'fresh' uniform or the 'shared' one that drafted the rejected token (the vLLM narrow-test bug).
    Returns counts [K+1, V]: row j = emitted token j, over the cycles that emitted it."""
    k, vocab = q_draw.shape
    g_draft, g_ver = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    q_seen = q_draw if q_seen is None else q_seen
    draft_probs = torch.cat([torch.full((1, vocab), 1.0 / vocab, dtype=q_seen.dtype), q_seen])
    u = torch.rand(n, k + 1, generator=g_draft, dtype=torch.float64)
    if noise == "multinomial":
        drafts = torch.multinomial(q_draw.float(), n, replacement=True, generator=g_draft).T.tolist()
    else:  # inverse CDF, vectorized: column j of u drafts position j
        cdf = q_draw.double().cumsum(-1)
        drafts = torch.searchsorted(cdf, (u[:, :k] * cdf[:, -1]).T.contiguous(), right=True).T.tolist()
    counts = np.zeros((k + 1, vocab), dtype=np.int64)
    base_coin = coin or generator_coin(g_ver)
    for i in range(n):
        accepted = [0]  # the draw happens at chain position = number of accepted nodes

        def counting_coin(prob, _acc=accepted):
            ok = base_coin(prob)
            _acc[0] += ok
            return ok

        if noise == "multinomial":
            draw = generator_draw(g_ver)
        elif noise == "shared":
            draw = lambda dist, _i=i, _acc=accepted: torch_inverse_cdf(dist, float(u[_i, _acc[0]]))
        else:
            draw = lambda dist: torch_inverse_cdf(dist, float(torch.rand((), generator=g_ver)))
        tokens = [0] + drafts[i]
        verdict = accept_sampled(list(range(-1, k)), tokens, p, draft_probs, counting_coin, draw)
        for j, t in enumerate(emitted(verdict, tokens)):
            counts[j, t] += 1
    return counts


def worst_position_excess(counts: np.ndarray, p: torch.Tensor) -> float:
    """max over positions of chi2 / threshold (positions reached at least 50 times)."""
    p = p.double().numpy()
    excess = [chi2_excess(c, c.sum() * p[j]) for j, c in enumerate(counts) if c.sum() >= 50]
    return max(excess)


def chain_dists(vocab: int, k: int, seed: int, params: SamplingParams, noise: float = 1.0):
    """Per-position target p [K+1, V] and draft q [K, V] through the same logits_to_probs."""
    g = torch.Generator().manual_seed(seed)
    target_logits = 2.0 * torch.randn(k + 1, vocab, generator=g)
    draft_logits = target_logits[:k] + noise * torch.randn(k, vocab, generator=g)
    return logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params), draft_logits


def narrow_dists(k: int = 2, seed: int = 0):
    """vLLM's narrow test: V=16, q = softmax(-target logits) (draft and target disagree most)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(k + 1, 16, generator=g)
    params = SamplingParams(temperature=1.0)
    return logits_to_probs(logits, params), logits_to_probs(-logits[:k], params)


class ReportsWrongQ:
    """A negative control: the drafter samples from its true laws but reports `wrong(q)` to the verifier
    (q [B, N, V], a copy; every other attribute is the wrapped drafter's)."""

    def __init__(self, drafter, wrong):
        self.drafter, self.wrong = drafter, wrong

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def propose(self, contexts, tree):
        batch = self.drafter.propose(contexts, tree)
        return replace(batch, q=None if batch.q is None else self.wrong(batch.q.clone()))
