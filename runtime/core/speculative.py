"""Speculative decoding: draft a tree, verify it in one target forward, accept losslessly, repeat.

    drafter = build_drafter("self:layers=24", target, parse_tree_spec("dynamic:depth=4,topk=2,tokens=8"))
    results = generate_speculative(target, drafter, prompts, SamplingParams(), max_new_tokens=128)
    results[0].mean_accepted, results[0].accept_rate_per_position

One cycle (docs/architecture.md, section 6), for all running rows of a batch at once:
  1. propose  the drafter returns each row's tree (root = the row's last committed token) with the law
              each drafted token was drawn from;
  2. verify   one target forward over every row's tree: trees are padded to the same node count, each
              node sees the committed context, its ancestors and itself (tree mask) at position
              root position + depth;
  3. accept   greedy or exact rejection sampling (acceptance.py's rule, batched through draftsmith.kernels
              by batch_accept.py) -> per row an accepted path + one token;
  4. commit   the target cache keeps the root and the accepted path's slots (KVCache.compact, no
              recompute), the drafter rolls back to the same path, tokens are emitted one by one and a
              row stops at EOS or at its token budget exactly where plain decoding would.
Rows accept different lengths in the same cycle; shorter rows leave holes in the cache that the valid
mask hides, and finished rows leave the batch. Prefill and the first token are plain decoding's own
code, so with an empty draft every cycle reduces to a plain decoding step.
"""

from __future__ import annotations

import time

import torch

from draftsmith.runtime.core.cycle_timing import PhaseClock
from draftsmith.runtime.core.engine import (
    GenerationResult,
    batches,
    prefill_features,
    stop_reason,
    token_budgets,
)
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import Draft, Drafter, root_only
from draftsmith.runtime.static.forward import GraphedForward
from draftsmith.runtime.verify.acceptance import Verdict
from draftsmith.runtime.verify.batch_accept import accept_batch
from draftsmith.runtime.verify.load_aware import LoadAwareDepth
from draftsmith.runtime.verify.sampling import SamplingParams, make_generators, next_tokens
from draftsmith.runtime.verify.tree import ancestor_mask, chain

DRAFT_SEED_SALT = 0x5EED  # the drafter's random streams differ from the verifier's (shared noise biases)


def generate_speculative(
    target: Target,
    drafter: Drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = False,
    policy: LoadAwareDepth | None = None,
    static: bool = False,
    sync_timing: bool = False,
) -> list[GenerationResult]:
    """Decode every prompt with speculation; rows are grouped into batches of `batch_size` in order.
    With a load-aware `policy`, each cycle drafts a chain of the depth it picks (0 = a plain step).
    `static` verifies on a preallocated cache with CUDA graphs (runtime/static/forward.py); rows then
    stay in the batch until all finish (fixed shapes), their late outputs ignored. Each cycle's draft and
    verify time is recorded per row (`sync_timing`: synchronize CUDA at the phase boundaries,
    runtime/core/cycle_timing.py)."""
    results: list[GenerationResult] = []
    desc = f"generate ({drafter.name})"
    for rows in batches(target, prompts, params, max_new_tokens, batch_size, progress, desc):
        gens = draft_gens = None
        if not params.greedy:
            gens = make_generators(seed, rows, target.device)
            draft_gens = make_generators(seed + DRAFT_SEED_SALT, rows, target.device)
        batch = [prompts[r] for r in rows]
        results += speculate_batch(
            target, drafter, batch, params, max_new_tokens, gens, draft_gens, policy, static, sync_timing
        )
    return results


@torch.inference_mode()
def speculate_batch(
    target: Target,
    drafter: Drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    generators: list[torch.Generator] | None,
    draft_generators: list[torch.Generator] | None,
    policy: LoadAwareDepth | None = None,
    static: bool = False,
    sync_timing: bool = False,
) -> list[GenerationResult]:
    start_time = time.perf_counter()
    clock = PhaseClock(target.device, sync_timing)
    budget = token_budgets(target, prompts, max_new_tokens)
    layers = drafter.capture_layers
    extra = static_capacity(drafter, len(prompts), max(budget)) if static else max(budget) + 64
    cache, logits, features = prefill_features(target, prompts, extra, layers, static)
    forward = cache.graphed if static else None  # graphs kept for later batches of this shape
    eos = set(target.eos_token_ids)
    results = [GenerationResult(p, [], "", 1, 0.0) for p in prompts]
    first = next_tokens(logits, params, generators).tolist()  # [B], plain decoding's first step
    ttft = time.perf_counter() - start_time
    for res, tok, row_budget in zip(results, first, budget, strict=True):
        res.ttft_s = ttft
        emit(res, [tok], row_budget, max_new_tokens, eos)
    # the drafter's own static cache holds at most what the target's does, plus the tree and pairs in flight
    tree_size = getattr(getattr(drafter, "tree", None), "size", 64)
    drafter.static_slots = cache.capacity + 2 * (tree_size + 1) if static else None
    drafter.start(prompts, params, draft_generators, features)
    active = list(range(len(prompts)))  # batch row -> result index
    # static batches keep finished rows: they step on root-only drafts, their tokens go to `beyond` so the
    # caches stay consistent with the contexts, and nothing of theirs is recorded
    beyond: list[list[int]] = [[] for _ in prompts]
    while True:
        running = [i for i, r in enumerate(active) if not results[r].finish_reason]
        if not running:
            break
        if len(running) < len(active) and not static:  # finished rows leave the batch
            rows = torch.tensor(running, device=target.device)
            cache.retain(rows)
            drafter.retain(running)
            generators = None if generators is None else [generators[i] for i in running]
            active = [active[i] for i in running]
            running = list(range(len(active)))
        contexts = [results[r].prompt_token_ids + results[r].token_ids + beyond[r] for r in active]
        before = drafter.forwards
        depth, draft_s = None, clock.now()
        if policy is not None:
            depth = policy.choose(len(running))
            drafter.tree = chain(depth) if depth else drafter.tree
        drafts = [root_only(c[-1]) for c in contexts] if depth == 0 else drafter.propose(contexts)
        drafts = [d if i in running else root_only(c[-1]) for i, (d, c) in enumerate(zip(drafts, contexts))]
        draft_s = clock.since(draft_s)
        verify_s = clock.now()
        verdicts, features = verify(target, cache, drafts, contexts, params, generators, layers, forward)
        verify_s = clock.since(verify_s)
        commit_s = clock.now()
        if depth == 0:
            drafter.skip(features)  # the drafter catches up at its next proposal
        else:
            drafter.commit([v.accepted for v in verdicts], features)
        times = (draft_s + clock.since(commit_s), verify_s)  # the drafter's rollback counts as drafting
        if policy is not None:
            policy.observe(len(running), depth, [len(verdicts[i].accepted) for i in running], draft_s)
        for r, draft, verdict in zip(active, drafts, verdicts, strict=True):
            new = [draft.tokens[i] for i in verdict.accepted] + [verdict.next_token]
            if results[r].finish_reason:
                beyond[r] += new
                continue
            record_cycle(results[r], draft, verdict, drafter.forwards - before, times)
            kept = len(results[r].token_ids)
            emit(results[r], new, budget[r], max_new_tokens, eos)
            beyond[r] += new[len(results[r].token_ids) - kept :]  # accepted past the row's EOS or budget
    wall = time.perf_counter() - start_time
    for res in results:
        res.wall_s = wall
    return results


def record_cycle(
    res: GenerationResult,
    draft: Draft,
    verdict: Verdict,
    draft_forwards: int,
    times: tuple[float, float] = (0.0, 0.0),
) -> None:
    """One cycle of a running row; `times` = (draft s, verify s) of the whole batch's cycle."""
    res.target_forwards += 1
    res.draft_forwards += draft_forwards
    res.accepted_lengths.append(len(verdict.accepted))
    res.draft_depths.append(draft.tree.max_depth)
    res.cycle_draft_s.append(times[0])
    res.cycle_verify_s.append(times[1])


def static_capacity(drafter: Drafter, batch: int, budget: int) -> int:
    """Slots a static cache needs past the prompts: each cycle the shared length grows by the longest
    accepted path (+1), while a row may commit only one token, so with several rows the worst case is
    budget cycles of (deepest path + 1); plus one tree in flight."""
    tree = getattr(drafter, "tree", None)
    depth, size = (tree.max_depth, tree.size) if tree is not None else (8, 64)
    return budget * (depth + 1 if batch > 1 else 1) + size + 1


def emit(res: GenerationResult, tokens: list[int], budget: int, max_new_tokens: int, eos: set[int]) -> None:
    """Append tokens one by one; stop exactly where plain decoding would (EOS kept, budget respected)."""
    for tok in tokens:
        res.token_ids.append(tok)
        res.finish_reason = stop_reason(tok, len(res.token_ids), budget, max_new_tokens, eos)
        if res.finish_reason:
            return


def verify(
    target: Target,
    cache: KVCache,
    drafts: list[Draft],
    contexts: list[list[int]],
    params: SamplingParams,
    generators: list[torch.Generator] | None,
    capture_layers: tuple[int, ...] = (),
    forward: GraphedForward | None = None,
) -> tuple[list[Verdict], list[torch.Tensor]]:
    """One target forward over every row's tree, the acceptance rule per row, then cache compaction.
    Also returns, per row, the target's features (hidden states after `capture_layers`, concatenated)
    at the root and the accepted nodes [1 + accepted, A*H] (empty list without capture layers)."""
    start = cache.length
    logits, fused = tree_logits(
        target, cache, drafts, contexts, capture_layers, forward
    )  # [B,N,V], [B,N,A*H]
    verdicts = accept_batch(drafts, logits, params, generators)
    keep_len = max(len(v.accepted) for v in verdicts) + 1
    keep = torch.full((len(drafts), keep_len), start, dtype=torch.long)
    keep_valid = torch.zeros(len(drafts), keep_len, dtype=torch.bool)
    features, in_place = [], True
    for b, v in enumerate(verdicts):
        path = [0, *v.accepted]  # the root and the accepted nodes; the next token is not computed yet
        keep[b, : len(path)] = start + torch.tensor(path)
        keep_valid[b, : len(path)] = True
        in_place &= path == list(range(len(path)))  # chains (and plain steps) accept a prefix of slots
        if fused is not None:
            features.append(fused[b, path])
    if in_place:  # nothing moves: drop the rejected slots instead of gathering every layer's K/V
        cache.keep_prefixes(start, [len(v.accepted) + 1 for v in verdicts])
    else:
        cache.compact(start, keep.to(target.device), keep_valid.to(target.device))
    return verdicts, features


def tree_logits(
    target: Target,
    cache: KVCache,
    drafts: list[Draft],
    contexts: list[list[int]],
    capture_layers: tuple[int, ...] = (),
    forward: GraphedForward | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Write every row's tree into the cache in one forward -> the target's logits after each node
    [B, N, V] (float32) and, with capture layers, its features [B, N, A*H]. Trees are padded to the
    largest; padding nodes see only themselves."""
    batch, nodes = len(drafts), max(d.tree.size for d in drafts)
    ids = torch.full((batch, nodes), target.pad_token_id, dtype=torch.long)
    valid = torch.zeros(batch, nodes, dtype=torch.bool)
    positions = torch.zeros(batch, nodes, dtype=torch.long)
    mask = torch.zeros(batch, nodes, nodes, dtype=torch.bool)  # [B, N, N]
    for b, (draft, ctx) in enumerate(zip(drafts, contexts, strict=True)):
        n = draft.tree.size
        ids[b, :n] = torch.tensor(draft.tokens).clamp(
            min=0
        )  # placeholders (-1) embed as id 0, never accepted
        valid[b, :n] = True
        positions[b] = len(ctx) - 1  # the root's position: the committed tokens before it
        positions[b, :n] += torch.tensor(draft.tree.depths)
        mask[b, :n, :n] = ancestor_mask(draft.tree)
    device = target.device
    if forward is not None:  # the static path: slots cache.length.., graph replay on CUDA
        logits, aux = forward(ids.to(device), positions.to(device), valid.to(device), mask.to(device))
        cache.advance(nodes)
        return logits, torch.cat(aux, dim=-1) if capture_layers else None
    tree_mask = None if nodes == 1 else mask.to(device)
    out = target.forward(
        ids.to(device),
        cache,
        positions.to(device),
        token_valid=valid.to(device),
        tree_mask=tree_mask,
        capture_layers=capture_layers,
    )
    fused = torch.cat([out.aux[i] for i in capture_layers], dim=-1) if capture_layers else None
    return target.logits(out.hidden), fused
