"""Speculative decoding: draft a tree, verify it in one target forward, accept losslessly, repeat.

    drafter = build_drafter("self:layers=24", target, parse_tree_spec("dynamic:depth=4,topk=2,tokens=8"))
    results = generate_speculative(target, drafter, prompts, SamplingParams(), max_new_tokens=128)
    results[0].mean_accepted, results[0].accept_rate_per_position

One cycle (docs/architecture.md, section 6), for all running rows of a batch at once:
  1. propose  the drafter returns every row's tree (root = the row's last committed token) with the law
              each drafted token was drawn from, as one DraftBatch on the device (runtime/verify/
              draft_batch.py); its budget (the tree, or the load-aware chain) is passed in each cycle;
  2. verify   one target forward over every row's tree: trees are padded to the same node count, each
              node sees the committed context, its ancestors and itself (tree mask) at position
              root position + depth;
  3. accept   greedy or exact rejection sampling (acceptance.py's rule, batched through draftsmith.kernels
              by batch_accept.py) -> per row an accepted path + one token, brought to the host with
              the cycle's one synchronization (`fetch`);
  4. commit   the target cache keeps the root and the accepted path's slots (KVCache.compact, no
              recompute), the drafter rolls back to the same path, tokens are emitted one by one and a
              row stops at EOS or at its token budget exactly where plain decoding would.
Rows accept different lengths in the same cycle; shorter rows leave holes in the cache that the valid
mask hides; finished rows ride along as plain steps (the drafter told they ended) until half the batch
has finished, then leave it. Prefill and the first token are plain decoding's own code, so with an empty
draft every cycle reduces to a plain decoding step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from draftsmith.runtime.core.collectives import CollectiveCounter
from draftsmith.runtime.core.cycle_timing import PhaseClock
from draftsmith.runtime.core.engine import (
    GenerationResult,
    batches,
    prefill_features,
    stop_reason,
    token_budgets,
)
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.static_forward import GraphedForward
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.adaptive import AdaptiveVerify
from draftsmith.runtime.verify.batch_accept import Fetched, accept_batch, fetch
from draftsmith.runtime.verify.calibration import SurvivalTally
from draftsmith.runtime.verify.draft_batch import DraftBatch, to_device
from draftsmith.runtime.verify.load_aware import LoadAwareDepth
from draftsmith.runtime.verify.sampling import SamplingParams, make_generators, next_tokens
from draftsmith.runtime.verify.tree import TreeSpec, chain

DRAFT_SEED_SALT = 0x5EED  # the drafter's random streams differ from the verifier's (shared noise biases)


def generate_speculative(
    target: Target,
    drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = False,
    policy: LoadAwareDepth | AdaptiveVerify | None = None,
    static: bool = False,
    sync_timing: bool = False,
    collectives: CollectiveCounter | None = None,
    calibration: SurvivalTally | None = None,
) -> list[GenerationResult]:
    """Decode every prompt with speculation; rows are grouped into batches of `batch_size` in order.
    With a load-aware `policy`, each cycle drafts a chain of the depth it picks (0 = a plain step); with an
    adaptive one (runtime/verify/adaptive.py), a chain of K of which each row verifies the prefix it keeps.
    `static` verifies on a preallocated cache with CUDA graphs (runtime/core/static_forward.py); rows then
    stay in the batch until all finish (fixed shapes), their late outputs ignored. Each cycle's draft and
    verify time is recorded per row (`sync_timing`: synchronize CUDA at the phase boundaries,
    runtime/core/cycle_timing.py); a `collectives` counter counts each phase's (a split target's); a
    `calibration` tally sums each verified draft's survival against what was accepted (on the device,
    runtime/verify/calibration.py)."""
    results: list[GenerationResult] = []
    desc = f"generate ({drafter.name})"
    for rows in batches(target, prompts, params, max_new_tokens, batch_size, progress, desc):
        gens = draft_gens = None
        if not params.greedy:
            gens = make_generators(seed, rows, target.device)
            draft_gens = make_generators(seed + DRAFT_SEED_SALT, rows, target.device)
        batch = [prompts[r] for r in rows]
        results += speculate_batch(
            target,
            drafter,
            batch,
            params,
            max_new_tokens,
            gens,
            draft_gens,
            policy,
            static,
            sync_timing,
            collectives,
            calibration,
        )
    return results


@dataclass
class Rows:
    """The batch's rows on the host: results, token budgets, and, for a static batch's finished rows,
    the tokens past their end (kept so the caches stay consistent with the contexts)."""

    results: list[GenerationResult]
    budget: list[int]
    beyond: list[list[int]]
    max_new_tokens: int
    eos: set[int]

    def contexts(self, active: list[int]) -> list[list[int]]:
        return [self.results[r].prompt_token_ids + self.results[r].token_ids + self.beyond[r] for r in active]

    def running(self, active: list[int]) -> list[int]:
        return [i for i, r in enumerate(active) if not self.results[r].finish_reason]

    def emit(self, r: int, new: list[int]) -> None:
        """Append a row's new tokens; what lies past its EOS or budget goes to `beyond`."""
        res = self.results[r]
        if res.finish_reason:
            self.beyond[r] += new
            return
        kept = len(res.token_ids)
        emit(res, new, self.budget[r], self.max_new_tokens, self.eos)
        self.beyond[r] += new[len(res.token_ids) - kept :]


@torch.inference_mode()
def speculate_batch(
    target: Target,
    drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    generators: list[torch.Generator] | None,
    draft_generators: list[torch.Generator] | None,
    policy: LoadAwareDepth | AdaptiveVerify | None = None,
    static: bool = False,
    sync_timing: bool = False,
    collectives: CollectiveCounter | None = None,
    calibration: SurvivalTally | None = None,
) -> list[GenerationResult]:
    start_time, clock = time.perf_counter(), PhaseClock(target.device, sync_timing, collectives)
    budget, layers = token_budgets(target, prompts, max_new_tokens), drafter.capture_layers
    extra = static_capacity(drafter.tree, len(prompts), max(budget)) if static else max(budget) + 64
    cache, logits, features = prefill_features(target, prompts, extra, layers, static)
    forward = cache.graphed if static else None  # graphs kept for later batches of this shape
    rows = Rows([GenerationResult(p, [], "", 1, 0.0) for p in prompts], budget, [[] for _ in prompts],
                max_new_tokens, set(target.eos_token_ids))  # fmt: skip
    first = next_tokens(logits, params, generators).tolist()  # [B], plain decoding's first step
    for r, tok in enumerate(first):
        rows.results[r].ttft_s = time.perf_counter() - start_time
        rows.emit(r, [tok])
    # the drafter's own static cache holds at most what the target's does, plus the tree and pairs in flight
    slots = cache.capacity + 2 * (drafter.tree.size + 1) if static else None
    drafter.start(prompts, params, draft_generators, features, static_slots=slots)
    active = list(range(len(prompts)))  # batch row -> result index
    backlog = True  # the drafter has tokens to catch up over at its next proposal (the prompt, plain steps)
    told: set[int] = set()  # results whose row the drafter knows ended
    while running := rows.running(active):
        tell_ended(drafter, rows, active, told)
        if compacts(len(running), len(active), static):  # finished rows leave the batch
            cache.retain(torch.tensor(running, device=target.device))
            drafter.retain(running)
            generators = None if generators is None else [generators[i] for i in running]
            active, running = [active[i] for i in running], list(range(len(running)))
        contexts, before = rows.contexts(active), drafter.forwards
        with clock.phase("draft"):
            depth = policy.choose(len(running)) if policy is not None else None
            batch = propose(drafter, contexts, depth, target.device)
            batch = batch.only_roots([i for i in range(len(active)) if i not in running])
        with clock.phase("verify"):
            batch = policy.budget(batch, len(running)) if policy is not None else batch  # adaptive:K's cut
            got, features = verify(target, cache, batch, contexts, params, generators, layers, forward)
        accepted = [v.accepted for v in got.verdicts]
        if calibration is not None:
            calibration.add(batch, accepted)  # the verified drafts: after the adaptive cut
        with clock.phase("rollback", tally="draft"):  # the drafter's rollback counts as drafting
            if depth == 0:
                drafter.skip(features)  # the drafter catches up at its next proposal
            else:
                drafter.commit(accepted, features, got.fetched)
        lap = clock.lap()
        times = (lap["draft"] + lap["rollback"], lap["verify"])
        if policy is not None:
            accepted_lengths = [len(accepted[i]) for i in running]
            policy.observe(len(running), depth, accepted_lengths, lap["draft"], running, catch_up=backlog)
        backlog = depth == 0
        for i, r in enumerate(active):
            if not rows.results[r].finish_reason:
                record_cycle(
                    rows.results[r], got.depths[i], len(accepted[i]), drafter.forwards - before, times
                )
            rows.emit(r, got.tokens[i])
    for res in rows.results:
        res.wall_s = time.perf_counter() - start_time
    return rows.results


def tell_ended(drafter, rows: Rows, active: list[int], told: set[int]) -> None:
    """Tell the drafter, once per row, which batch rows have finished (`told` holds their result indices)."""
    if ended := [i for i, r in enumerate(active) if rows.results[r].finish_reason and r not in told]:
        drafter.ended(ended)
        told.update(active[i] for i in ended)


def compacts(running: int, rows: int, static: bool) -> bool:
    """Whether finished rows leave the batch now: once half of it has finished (never on the static
    path). Until then they ride along as plain steps, drafting nothing: dropping a row copies the whole
    cache, and a GEMM over an odd row count can cost more than the even one above it (on a 2-core Xeon the
    135M target's LM head took 10.2 ms over 15 rows and 6.9 ms over 16; BENCHMARKS "adaptive:K")."""
    return not static and running <= rows // 2


def propose(drafter, contexts: list[list[int]], depth: int | None, device) -> DraftBatch:
    """This cycle's drafts: the drafter's tree, or the load-aware policy's chain (depth 0: none)."""
    if depth == 0:
        return DraftBatch.roots([c[-1] for c in contexts], device)
    tree: TreeSpec = chain(depth) if depth else drafter.tree
    batch = drafter.propose(contexts, tree)
    return batch if batch.device == torch.device(device) else batch.to(device)  # a drafter elsewhere


def record_cycle(
    res: GenerationResult,
    depth: int,
    accepted: int,
    draft_forwards: int,
    times: tuple[float, float] = (0.0, 0.0),
) -> None:
    """One cycle of a running row; `times` = (draft s, verify s) of the whole batch's cycle."""
    res.target_forwards += 1
    res.draft_forwards += draft_forwards
    res.accepted_lengths.append(accepted)
    res.draft_depths.append(depth)
    res.cycle_draft_s.append(times[0])
    res.cycle_verify_s.append(times[1])


def static_capacity(tree: TreeSpec, batch: int, budget: int) -> int:
    """Slots a static cache needs past the prompts: each cycle the shared length grows by the longest
    accepted path (+1), while a row may commit only one token, so with several rows the worst case is
    budget cycles of (deepest path + 1); plus one tree in flight."""
    return budget * (tree.max_depth + 1 if batch > 1 else 1) + tree.size + 1


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
    batch: DraftBatch,
    contexts: list[list[int]],
    params: SamplingParams,
    generators: list[torch.Generator] | None,
    capture_layers: tuple[int, ...] = (),
    forward: GraphedForward | None = None,
) -> tuple[Fetched, list[torch.Tensor]]:
    """One target forward over every row's tree, the acceptance rule per row (its result fetched to the
    host in one transfer), then cache compaction. Also returns, per row, the target's features (hidden
    states after `capture_layers`, concatenated) at the root and the accepted nodes [1 + accepted, A*H]
    (empty list without capture layers)."""
    start = cache.length
    logits, fused = tree_logits(target, cache, batch, contexts, capture_layers, forward)  # [B,N,V], [B,N,A*H]
    got = fetch(batch, accept_batch(batch, logits, params, generators))
    paths = [[0, *v.accepted] for v in got.verdicts]  # the root and the accepted nodes
    features = [] if fused is None else [fused[b, path] for b, path in enumerate(paths)]
    if all(path == list(range(len(path))) for path in paths):  # chains and plain steps keep a prefix
        cache.keep_prefixes(start, [len(path) for path in paths])  # nothing moves: no K/V gathered
        return got, features
    cache.keep_rows(start, [[start + n for n in path] for path in paths])
    return got, features


def tree_logits(
    target: Target,
    cache: KVCache,
    batch: DraftBatch,
    contexts: list[list[int]],
    capture_layers: tuple[int, ...] = (),
    forward: GraphedForward | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Write every row's tree into the cache in one forward -> the target's logits after each node
    [B, N, V] (float32) and, with capture layers, its features [B, N, A*H]. Inputs are built on the
    device from the DraftBatch (DraftBatch.verify_inputs); padding nodes see only themselves."""
    roots = to_device([len(ctx) - 1 for ctx in contexts], target.device)  # the committed tokens before
    ids, positions, valid, mask = batch.verify_inputs(roots, target.pad_token_id)
    if forward is not None:  # the static path: slots cache.length.., graph replay on CUDA
        logits, aux = forward(ids, positions, valid, mask)
        cache.advance(ids.shape[1])
        return logits, torch.cat(aux, dim=-1) if capture_layers else None
    tree_mask = None if ids.shape[1] == 1 else mask
    # every row a full tree (host knowledge): no padding node, so the cache gets no hole and a plain step
    # (N = 1) keeps SDPA's own causal kernel, as plain decoding does (a mask costs ~7% of a batch-1 step)
    dense = all(n == ids.shape[1] for n in batch.sizes)
    out = target.forward(
        ids,
        cache,
        positions,
        token_valid=None if dense else valid,
        tree_mask=tree_mask,
        capture_layers=capture_layers,
    )
    fused = torch.cat([out.aux[i] for i in capture_layers], dim=-1) if capture_layers else None
    return target.logits(out.hidden), fused
