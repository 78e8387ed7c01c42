"""The TTT step's attention without a dense mask: EAGLE-3's decomposition (Li et al. 2025, "EAGLE-3:
Scaling up Inference Acceleration of Large Language Models via Training-Time Test"; their trainer's
`LlamaAttention` and SpecForge's flash/flex backends compute the same). Only torch is imported.

    out = ttt_attention(q, k0, v0, diag_k, diag_v)   # = SDPA over (k+1)T keys with step_mask's [T, (k+1)T]

At training-time-test step k the query at position t sees the drafter's tree: the step-0 keys at s <= t
(the committed prefix) and its own keys of steps 1..k at t (its ancestors in the chain drafted from t).
So the score matrix is a causal [T, T] block plus k diagonals, and the attention splits exactly:

    o_c, l_c = causal attention over the step-0 keys and its log-sum-exp     [B, Hq, T, d], [B, Hq, T]
    b_j      = scale * <q_t, k_j[t]>       j = 1..k (one dot product each)   [B, Hq, T]
    l        = logsumexp(l_c, b_1, .., b_k)                                  softmax over the union
    out      = exp(l_c - l) * o_c + sum_j exp(b_j - l) * v_j[t]

The causal part (`causal_attention_lse`) runs, by default, a path CI runs: on CPU PyTorch's flash kernel
(what SDPA with is_causal=True runs, no mask tensor), elsewhere (CUDA included) the explicit [T, T] scores.
`backend="flex"` (train.ttt_attention=flex) runs FlexAttention compiled over a causal block mask
(gpu_kernels/flex.py): a GPU-only path that no CI run executes, so it is an explicit choice that logs
itself until a recorded GPU run (scripts/gpu_check.sh measures it against the default) promotes it.
Autograd differentiates the merge; the kernels give the gradient of both o_c and l_c. With a fused kernel
memory per step is O(T) (no [T, (k+1)T] mask, no concatenated keys; the explicit scores keep [T, T]), and
a step costs the causal attention plus k elementwise products, instead of an attention over (k+1)T keys.

GQA: query head h reads kv head h // (Hq / Hkv), as SDPA's enable_gqa does. Padding needs nothing here:
training rows are right-padded and attention is causal, so a real position never reads a padded key,
which is also all that today's mask guarantees (`GrowingCache` marks every slot valid).
"""

from __future__ import annotations

import logging

import torch
from torch.nn import functional as F

log = logging.getLogger("draftsmith")
_said: set[str] = set()


def ttt_attention(
    q: torch.Tensor,  # [B, Hq, T, d] the step-k queries
    k0: torch.Tensor,  # [B, Hkv, T, d] the step-0 keys
    v0: torch.Tensor,  # [B, Hkv, T, d]
    diag_k: list[torch.Tensor],  # k tensors [B, Hkv, T, d]: the keys of steps 1..k (position t at t)
    diag_v: list[torch.Tensor],
    backend: str | None = None,  # "flash_cpu" | "flex" | "math"; None = by device (`default_backend`)
) -> torch.Tensor:
    """Attention over the step-0 keys (causal) and the k diagonal keys, softmax over their union ->
    [B, Hq, T, d] in q's dtype."""
    scale = q.shape[-1] ** -0.5  # SDPA's default, as the head's attention uses
    out, lse = causal_attention_lse(q, k0, v0, scale, backend)  # [B, Hq, T, d], [B, Hq, T]
    if not diag_k:
        return out
    batch, heads, length, dim = q.shape
    groups = heads // k0.shape[1]
    acc = torch.promote_types(q.dtype, torch.float32)  # merge at least in fp32, as SDPA accumulates
    grouped = q.to(acc).view(batch, -1, groups, length, dim)  # [B, Hkv, G, T, d]: heads sharing a kv head
    scores = [lse.to(acc).view(batch, -1, groups, length)]  # [B, Hkv, G, T] each
    scores += [scale * (grouped * key.to(acc)[:, :, None]).sum(-1) for key in diag_k]
    weights = torch.softmax(torch.stack(scores), dim=0)  # [k+1, B, Hkv, G, T] = exp(score - l)
    merged = weights[0, ..., None] * out.to(acc).view(batch, -1, groups, length, dim)
    for j, value in enumerate(diag_v, start=1):
        merged = merged + weights[j, ..., None] * value.to(acc)[:, :, None]
    return merged.view(batch, heads, length, dim).to(q.dtype)


def default_backend(q: torch.Tensor) -> str:
    """The path CI runs on this device: the CPU flash kernel on a CPU, the explicit scores elsewhere."""
    return "flash_cpu" if q.device.type == "cpu" else "math"


def causal_attention_lse(
    q: torch.Tensor,  # [B, Hq, T, d]
    k: torch.Tensor,  # [B, Hkv, T, d]
    v: torch.Tensor,  # [B, Hkv, T, d]
    scale: float,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention -> (out [B, Hq, T, d], its log-sum-exp [B, Hq, T]), both differentiable."""
    backend = backend or default_backend(q)
    if backend == "flash_cpu":
        return _FlashCpuCausal.apply(q, k, v, scale)
    if backend == "flex":
        from draftsmith.kernels.flex import causal_attention_flex

        if "flex" not in _said:
            _said.add("flex")
            log.info("TTT attention: FlexAttention%s, a GPU-only path no CI run executes (the default: "
                     "the explicit scores; scripts/gpu_check.sh measures both)",
                     " compiled" if q.device.type == "cuda" else "")  # fmt: skip
        return causal_attention_flex(q, k, v, scale)
    if backend == "math":
        return causal_attention_math(q, k, v, scale)
    raise ValueError(f"unknown TTT attention backend {backend!r} (flash_cpu, flex, math)")


def causal_attention_math(q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit [T, T] scores (any device and dtype; the oracle of the fused kernels)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, Hq, T, T]
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


class _FlashCpuCausal(torch.autograd.Function):
    """PyTorch's CPU flash kernel (the one SDPA runs for is_causal=True), with the log-sum-exp as a
    differentiable output. Its backward computes dS = P * (dP - D) with D = rowsum(dO * O); the lse's
    gradient g adds P * g, i.e. D -> D - g. One extra channel carries it exactly: q, k and v get a zero
    channel (scores and dP unchanged), O gets -g and dO gets 1."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)

        def pad(x):  # [.., d] -> [.., d+1] with a zero last channel
            return F.pad(x, (0, 1))

        out = torch.cat([out, -grad_lse[..., None].to(out.dtype)], dim=-1)
        grad_out = torch.cat([grad_out, torch.ones_like(grad_out[..., :1])], dim=-1)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out.contiguous(), pad(q), pad(k), pad(v), out, lse, 0.0, True, scale=ctx.scale
        )
        return (*(g[..., :-1] for g in grads), None)
