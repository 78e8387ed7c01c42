"""Plain KV-cached decoding (`--draft none`): the loop the speculative engine extends.

    results = generate_plain(target, [target.encode("Hi")], SamplingParams(), max_new_tokens=64)

Batches are left-padded; padding lives in the cache's `valid` mask and every row gets position ids
that count only its real tokens, so a padded row computes what it would alone (up to float rounding
of batched matmuls). Each row samples with its own generator seeded by (seed, row index). A row stops at
an EOS token (which is kept, as `generate()` keeps it), at max_new_tokens, or at the end of the
target's context.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from draftsmith.runtime.core.collectives import CollectiveCounter, maybe_phase
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.static_forward import causal, static_forward, static_session
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams, make_generators, next_tokens


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]  # new tokens only, EOS included when it was generated
    finish_reason: str  # "eos", "length" or "context"
    target_forwards: int  # forwards this row took part in (prefill included)
    wall_s: float  # wall time of the batch this row ran in
    draft_forwards: int = 0  # draft model forwards this row took part in
    accepted_lengths: list[int] = field(default_factory=list)  # per cycle: drafted tokens accepted
    draft_depths: list[int] = field(default_factory=list)  # per cycle: depth of the drafted tree
    ttft_s: float = 0.0  # time from the batch's start to this row's first new token (prefill included)
    # per cycle, of the whole batch's cycle (runtime/core/cycle_timing.py): drafting (propose + the
    # drafter's commit) and verification (the target's tree forward, acceptance, cache compaction), seconds
    cycle_draft_s: list[float] = field(default_factory=list)
    cycle_verify_s: list[float] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_accepted(self) -> float:
        """tau: tokens committed per target forward, the bonus token (and the prefill's token) counted."""
        return self.new_tokens / max(self.target_forwards, 1)

    @property
    def accept_rate_per_position(self) -> list[float]:
        return accept_rates(self.accepted_lengths, self.draft_depths)


def accept_rates(accepted_lengths: list[int], draft_depths: list[int]) -> list[float]:
    """[k-1] = share of the cycles that drafted a k-th token in which that token was accepted."""
    pairs = list(zip(accepted_lengths, draft_depths, strict=True))
    rates = []
    for k in range(1, max(draft_depths, default=0) + 1):
        tried = [a for a, d in pairs if d >= k]
        rates.append(sum(a >= k for a in tried) / len(tried))
    return rates


def check_prompts(target: Target, prompts: list[list[int]], max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BadInputError("max_new_tokens", max_new_tokens, "an integer >= 1")
    if not prompts:
        raise BadInputError("prompts", prompts, "at least one prompt")
    for i, ids in enumerate(prompts):
        if not ids:
            raise BadInputError(f"prompts[{i}]", "", "a prompt of at least one token")
        if len(ids) >= target.max_context:
            raise BadInputError(
                f"prompts[{i}]",
                f"{len(ids)} tokens",
                f"fewer than {target.max_context} tokens (the context of {target.name})",
            )


def batches(
    target: Target,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    batch_size: int,
    progress: bool,
    desc: str,
) -> Iterator[list[int]]:
    """Check a run's inputs, then yield the row indices of each batch in order (with a progress bar)."""
    params.validate()
    check_prompts(target, prompts, max_new_tokens)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadInputError("batch_size", batch_size, "an integer >= 1")
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress or len(starts) < 2):
        yield list(range(start, min(start + batch_size, len(prompts))))


def generate_plain(
    target: Target,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = False,
    static: bool = False,
    collectives: CollectiveCounter | None = None,
) -> list[GenerationResult]:
    """Decode every prompt (token ids); rows are grouped into batches of `batch_size` in order. `static`
    runs the target on a preallocated cache with CUDA graphs (runtime/core/static_forward.py); a
    `collectives` counter counts each step's (a split target's) as the phase "step"."""
    results: list[GenerationResult] = []
    for rows in batches(target, prompts, params, max_new_tokens, batch_size, progress, "generate"):
        generators = None if params.greedy else make_generators(seed, rows, target.device)
        batch = [prompts[r] for r in rows]
        results += decode_batch(target, batch, params, max_new_tokens, generators, static, collectives)
    return results


def prefill(target: Target, prompts: list[list[int]], extra: int) -> tuple[KVCache, torch.Tensor]:
    """Left-pad the prompts, run them through the target -> (cache, logits after each prompt [B, V])."""
    cache, logits, _ = prefill_features(target, prompts, extra, ())
    return cache, logits


def prefill_features(
    target: Target,
    prompts: list[list[int]],
    extra: int,
    capture_layers: tuple[int, ...],
    static: bool = False,
) -> tuple[KVCache, torch.Tensor, list[torch.Tensor]]:
    """`prefill`, plus each row's hidden states after `capture_layers`, concatenated in that order and
    without padding: features[i] is [len(prompts[i]), A*H] (what feature heads such as EAGLE-3 read).
    `static` prefills a StaticKVCache of capacity width + extra through the static forward."""
    device, batch = target.device, len(prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((batch, width), target.pad_token_id, dtype=torch.long)
    valid = torch.zeros(batch, width, dtype=torch.bool)
    for i, ids in enumerate(prompts):  # left padding
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        valid[i, width - len(ids) :] = True
    input_ids, valid = input_ids.to(device), valid.to(device)
    positions = (valid.cumsum(dim=1) - 1).clamp(min=0)  # [B, T]
    if static:
        cache = static_session(target, batch, width + extra, capture_layers).cache
        slots = torch.arange(width, device=device)
        span = cache.span_for(width)  # attend over the prompt's window, not the whole capacity
        mask = causal(batch, width, device)
        logits, aux = static_forward(
            target, cache, input_ids, positions, valid, slots, mask, capture_layers, span
        )
        cache.advance(width)
        logits = logits[:, -1]
    else:
        cache = target.new_cache(batch, width + extra)
        ragged = len({len(p) for p in prompts}) > 1  # left padding: holes the masks must hide
        token_valid = valid if ragged else None
        out = target.forward(
            input_ids, cache, positions, token_valid=token_valid, capture_layers=capture_layers
        )
        logits, aux = target.logits(out.hidden[:, -1]), [out.aux[i] for i in capture_layers]
    features = []
    if capture_layers:
        fused = torch.cat(aux, dim=-1)  # [B, T, A*H]
        features = [fused[i, width - len(ids) :] for i, ids in enumerate(prompts)]
    return cache, logits, features  # [B, V]


def token_budgets(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[int]:
    return [min(max_new_tokens, target.max_context - len(p)) for p in prompts]


def stop_reason(token: int, emitted: int, budget: int, max_new_tokens: int, eos: set[int]) -> str:
    """Why a row stops after emitting `token` as its `emitted`-th new token ("" = it goes on)."""
    if token in eos:
        return "eos"
    if emitted >= budget:
        return "length" if budget == max_new_tokens else "context"
    return ""


@torch.inference_mode()
def decode_batch(
    target: Target,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    generators: list[torch.Generator] | None,
    static: bool = False,
    collectives: CollectiveCounter | None = None,
) -> list[GenerationResult]:
    start_time = time.perf_counter()
    device, batch = target.device, len(prompts)
    budget = token_budgets(target, prompts, max_new_tokens)
    cache, logits, _ = prefill_features(target, prompts, max(budget), (), static)
    step = cache.graphed if static else None  # the session's graphs, captured by an earlier batch or now
    every = torch.ones(batch, 1, dtype=torch.bool, device=device)  # [B, 1] step tokens are real
    self_only = every[:, :, None]  # [B, 1, 1] tree mask of a one-token step
    next_pos = torch.tensor([[len(p)] for p in prompts], device=device)  # [B, 1]
    eos = set(target.eos_token_ids)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    forwards = [1] * batch
    finish = [""] * batch
    ttft = None
    while True:
        chosen = next_tokens(logits, params, generators).tolist()  # [B]
        ttft = ttft or time.perf_counter() - start_time
        for i, tok in enumerate(chosen):
            if finish[i]:
                continue
            tokens[i].append(tok)
            finish[i] = stop_reason(tok, len(tokens[i]), budget[i], max_new_tokens, eos)
        if all(finish):
            break
        # Finished rows keep stepping on their last token (fixed batch shape); their outputs are unused.
        step_ids = torch.tensor([[t[-1]] for t in tokens], device=device)  # [B, 1]
        with maybe_phase(collectives, "step"):
            if step is None:
                logits = target.logits(target.forward(step_ids, cache, next_pos).hidden[:, -1])
            else:
                logits = step(step_ids, next_pos, every, self_only)[0][:, -1]  # graph replay on CUDA
                cache.advance(1)
        next_pos = next_pos + 1
        for i in range(batch):
            forwards[i] += not finish[i]
    wall = time.perf_counter() - start_time
    return [
        GenerationResult(p, t, f, n, wall, ttft_s=ttft)
        for p, t, f, n in zip(prompts, tokens, finish, forwards, strict=True)
    ]
