"""draftsmith.kernels: Triton kernels, each next to a pure-torch `*_ref` oracle of the same signature.

    from draftsmith import kernels
    kernels.kv_compact(cache_layer, start, keep)                   # KV-cache path compaction, in place
    out = kernels.tree_attention(q, k, v, mask, scale)             # tree-verification attention (GQA)
    out = kernels.tree_attention_flex(q, k, v, mask, scale)        # the same on FlexAttention (flex.py)
    num, nxt = kernels.chain_accept_greedy(logits, tokens)         # chain verification at temperature 0
    num, nxt = kernels.chain_accept(p, q, tokens, coins, draws)    # exact chain rejection sampling
    path, num, nxt = kernels.tree_accept_greedy(parents, tokens, logits)          # any tree, T = 0
    path, num, nxt = kernels.tree_accept(parents, tokens, p, q, coins, draws)     # any tree, exact, T > 0

Which implementation runs: `DRAFTSMITH_KERNELS` = `auto` (default) or `torch`: the torch references on
every device, the path CI runs; `triton`: the kernels, on CUDA or on CPU under Triton's interpreter
(TRITON_INTERPRET=1). Compiled Triton on a GPU is a path no CI run executes, so it is an explicit choice
that says so once in the log, until a recorded GPU run (scripts/gpu_check.sh measures it against the
references) promotes it. A request for kernels that cannot run here falls back to the references with one
log line, never a crash. Inputs are validated (shapes,
dtypes, devices) before either runs. Modules: `reference` (the torch oracles), `triton_kernels` (the
Triton kernels), `flex` (tree attention on FlexAttention), `compile_check` (compiling the kernels for
a GPU architecture without one).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os

import torch

from draftsmith.kernels.reference import (
    chain_accept_greedy_ref,
    chain_accept_ref,
    kv_compact_ref,
    tree_accept_greedy_ref,
    tree_accept_ref,
    tree_attention_ref,
)

log = logging.getLogger("draftsmith")
MODES = ("auto", "triton", "torch")
_warned: set[str] = set()


@functools.cache
def _triton_importable() -> bool:  # cached: find_spec stats the file system, and this runs every cycle
    return importlib.util.find_spec("triton") is not None


def use_triton(device: torch.device) -> bool:
    """Whether the Triton kernels run for tensors on `device` (see the module docstring)."""
    mode = os.environ.get("DRAFTSMITH_KERNELS", "auto")
    if mode not in MODES:
        raise ValueError(f"DRAFTSMITH_KERNELS: got {mode!r}, expected one of {MODES}")
    if mode == "torch":
        return False
    if mode == "auto":
        return False
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not (_triton_importable() and (device.type == "cuda" or interpreted)):
        why = "Triton is not installed" if not _triton_importable() else f"no CUDA for {device}"
        if why not in _warned:
            _warned.add(why)
            log.info("kernels: DRAFTSMITH_KERNELS=triton, but %s: using the torch references", why)
        return False
    if device.type == "cuda" and not interpreted and "gpu" not in _warned:
        _warned.add("gpu")
        log.info("kernels: Triton compiled for %s, a GPU-only path no CI run executes (the default: the "
                 "torch references; scripts/gpu_check.sh measures both)", device)  # fmt: skip
    return True


def _impl():
    from draftsmith.kernels import triton_kernels

    return triton_kernels


def _check(name: str, tensor: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...], device) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != ndim:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name}: got {got}, expected a {ndim}-d tensor")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name}: got dtype {tensor.dtype}, expected one of {dtypes}")
    if tensor.device != device:
        raise ValueError(f"{name}: on {tensor.device}, expected {device} like the other inputs")


FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32)


def kv_compact(cache: torch.Tensor, start: int, keep: torch.Tensor) -> None:
    """cache [B, H, C, D]; keep [B, n] increasing slot ids in [start, C): moved to start..start+n-1."""
    _check("cache", cache, 4, FLOATS, cache.device)
    _check("keep", keep, 2, INTS, cache.device)
    if keep.shape[0] != cache.shape[0] or not 0 <= start <= cache.shape[2] - keep.shape[1]:
        raise ValueError(f"keep {tuple(keep.shape)} / start {start} do not fit cache {tuple(cache.shape)}")
    (_impl().kv_compact if use_triton(cache.device) else kv_compact_ref)(cache, start, keep)


def chain_accept_greedy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K+1, V], tokens [B, K] -> (accepted count [B], next token [B])."""
    _check("logits", logits, 3, FLOATS, logits.device)
    _check("tokens", tokens, 2, INTS, logits.device)
    if tokens.shape != (logits.shape[0], logits.shape[1] - 1):
        raise ValueError(f"tokens {tuple(tokens.shape)} do not match logits {tuple(logits.shape)}")
    if use_triton(logits.device):
        return _impl().chain_accept_greedy(logits, tokens)
    return chain_accept_greedy_ref(logits, tokens)


def chain_accept(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tokens: torch.Tensor,
    coins: torch.Tensor,
    draws: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """p [B, K+1, V], q [B, K, V], tokens [B, K], coins [B, K], draws [B] (float32 uniforms in [0, 1))."""
    device = target_probs.device
    _check("target_probs", target_probs, 3, (torch.float32,), device)
    _check("draft_probs", draft_probs, 3, (torch.float32,), device)
    _check("tokens", tokens, 2, INTS, device)
    _check("coins", coins, 2, (torch.float32,), device)
    _check("draws", draws, 1, (torch.float32,), device)
    batch, k1, vocab = target_probs.shape
    if draft_probs.shape != (batch, k1 - 1, vocab) or tokens.shape != (batch, k1 - 1) or k1 < 2:
        raise ValueError(
            f"shapes p {tuple(target_probs.shape)}, q {tuple(draft_probs.shape)}, tokens "
            f"{tuple(tokens.shape)}: expected [B, K+1, V], [B, K, V], [B, K] with K >= 1"
        )
    if coins.shape != tokens.shape or draws.shape != (batch,):
        raise ValueError(f"coins {tuple(coins.shape)} / draws {tuple(draws.shape)}: expected [B, K] / [B]")
    impl = _impl().chain_accept if use_triton(device) else chain_accept_ref
    return impl(target_probs, draft_probs, tokens, coins, draws)


def _check_tree(parents: torch.Tensor, tokens: torch.Tensor, per_node: torch.Tensor, name: str) -> None:
    device = per_node.device
    _check(name, per_node, 3, FLOATS if name == "logits" else (torch.float32,), device)
    _check("parents", parents, 2, INTS, device)
    _check("tokens", tokens, 2, INTS, device)
    if parents.shape != per_node.shape[:2] or tokens.shape != per_node.shape[:2]:
        raise ValueError(
            f"parents {tuple(parents.shape)} / tokens {tuple(tokens.shape)}: expected "
            f"{tuple(per_node.shape[:2])} like {name} {tuple(per_node.shape)}"
        )


def tree_accept_greedy(
    parents: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """parents/tokens [B, N] (node ids topological, parent -1 = root or padding), logits [B, N, V]
    -> (path [B, N] accepted node ids then -1, count [B], next token [B])."""
    _check_tree(parents, tokens, logits, "logits")
    impl = _impl().tree_accept_greedy if use_triton(logits.device) else tree_accept_greedy_ref
    return impl(parents, tokens, logits)


def tree_accept(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    coins: torch.Tensor,
    draws: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p [B, N, V], q [B, N, V] or None (point masses), coins [B, N], draws [B] (float32 uniforms)
    -> (path [B, N], count [B], next token [B]); see reference.tree_accept_ref for the rule."""
    device = target_probs.device
    _check_tree(parents, tokens, target_probs, "target_probs")
    if draft_probs is not None:
        _check("draft_probs", draft_probs, 3, (torch.float32,), device)
        if draft_probs.shape != target_probs.shape:
            raise ValueError(f"draft_probs {tuple(draft_probs.shape)}: expected {tuple(target_probs.shape)}")
    _check("coins", coins, 2, (torch.float32,), device)
    _check("draws", draws, 1, (torch.float32,), device)
    if coins.shape != tokens.shape or draws.shape != tokens.shape[:1]:
        raise ValueError(f"coins {tuple(coins.shape)} / draws {tuple(draws.shape)}: expected [B, N] / [B]")
    impl = _impl().tree_accept if use_triton(device) else tree_accept_ref
    return impl(parents, tokens, target_probs, draft_probs, coins, draws)


def _check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None:
    device = q.device
    _check("q", q, 4, FLOATS, device)
    _check("k", k, 4, (q.dtype,), device)
    _check("v", v, 4, (q.dtype,), device)
    _check("mask", mask, 4, (torch.bool,), device)
    batch, heads, nodes, dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != dim or heads % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} and k/v {tuple(k.shape)}/{tuple(v.shape)} do not match")
    if mask.shape != (batch, 1, nodes, k.shape[2]):
        raise ValueError(f"mask {tuple(mask.shape)}: expected {(batch, 1, nodes, k.shape[2])}")


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, S, D] (Hq a multiple of Hkv), mask [B, 1, T, S] bool -> [B, Hq, T, D].
    Every query row must allow at least one key (runtime/core/masks.py guarantees its own slot)."""
    _check_attention(q, k, v, mask)
    impl = _impl().tree_attention if use_triton(q.device) else tree_attention_ref
    return impl(q, k, v, mask, scale)


def tree_attention_flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """tree_attention on PyTorch's FlexAttention instead (gpu_kernels/flex.py): same inputs, same result."""
    from draftsmith.kernels.flex import tree_attention_flex as flex

    _check_attention(q, k, v, mask)
    return flex(q, k, v, mask, scale)
