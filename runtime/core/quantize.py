"""Weight-only quantization of the target and of draft heads: int8 and int4 on the CPU, FP8 (e4m3) on GPUs.

    spec = parse_quantize("int4", group_size=None)      # QuantSpec("int4", 64 for SmolLM2's 576-wide layers)
    quantize_target(target, spec)                       # the target's decoder linears and its LM head
    quantize_draft(drafter, target, parse_quantize("int8"))   # the drafter's own linears, never the target's

What a quantized linear computes (y = x W^T + b, W [N out, K in]):
- int8: W ~= q * s, q in [-127, 127] int8, one scale per output row (torch.ops.aten._weight_int8pack_mm
  takes [N] scales, so per channel is the kernel's only grouping);
- int4: W ~= (q - 8) * s + z per group of `group_size` inputs, q in [0, 15], scale and zero per (group,
  row) (torch.ops.aten._weight_int4pack_mm_for_cpu on _convert_weight_to_int4pack_for_cpu's packing;
  the kernel takes groups of 32, 64, 128 or 256 that divide K);
- fp8 (CUDA with float8 matmuls, compute capability >= 8.9: Ada, Hopper, Blackwell): W ~= e4m3(W / s) * s
  per output row, activations scaled per row to e4m3, torch._scaled_mm.
Scales and zeros are bfloat16 (the CPU kernels take them in the activations' dtype) and chosen so the
bf16 grid covers every weight of its row or group: |W - dequantized| <= s / 2 per element (int8, int4;
tests/runtime/test_quantize.py). The CPU kernels run with bf16 activations, cast in and out around each
linear; norms, attention and residuals stay fp32. Rows of one call are independent dot products (a
token's row is bit for bit the same alone or among 16, for every SmolLM2 shape), and the verification
rule compares against the quantized target's own logits, so speculation keeps the quantized target's
law: zero greedy mismatches and the sampled law on the tiny targets (tests). One caveat, as for bf16
targets: the fp32 attention of a 1-token step and of an M-token verification differ in their last bits,
and a bf16 cast now and then turns that into one bf16 step; the logits themselves come out of the LM
head in bf16 (ulp 0.125 at |logit| ~ 20), so top-2 ties at that resolution occur. Plain decoding breaks
a tie by the lowest id, a verification forward may land one ulp apart. Measured on SmolLM2 (6 held-out
ShareGPT prompts, 48 tokens, the Medusa-1 head): int8 2/6 prompts part from plain decoding of the same
int8 target, at a gap of 0 and of 1 bf16 ulp; int4 0/6. runtime/verify/near_tie.py judges a quantized
target's mismatches in bf16 ulps, as bench's greedy check does for bf16 targets.

Why these kernels (scripts/quant_matmul_bench.py, the whole stack of SmolLM2-135M's linears with random
weights, every weight read once per pass as in a decode step; 1 thread, AVX-512 AMD EPYC, shared with
other jobs; ms for the 210 layer linears + the LM head, median of 5 rounds, interleaved):

    rows M   fp32 F.linear   bf16 F.linear   int8 aten   int4 aten (g64)   int8 torchao   int4 torchao
    1        54.6 + 7.2      17.4 + 3.5      8.0 + 1.8   4.6 + 1.2         27.6 + 28.9    11.6 + 1.2
    4        140  + 44       72   + 15       25  + 8     23  + 2           106  + 110     36   + 2
    8        95   + 31       40   + 8        29  + 8     23  + 7           57   + 62      31   + 7

torchao 0.18 (installed beside the venv, not a dependency) runs int8 weight-only as a cast of the int8
weight to the activations' dtype and a dense matmul (3-10x slower than aten's int8 kernel here) and its
CPU int4 path calls the same aten kernel with tensor-subclass dispatch on top (2.5x slower at M = 1), so
the aten kernels are used directly. They need bf16 activations: with fp32 ones they take a scalar path
(one 1536x576 weight, M = 1: int8 1293 us and int4 2533 us against fp32 F.linear's 68 us and 27 us with
bf16 activations). The LM head is quantized too: at int8 it costs 1.8 ms against 7.2 ms in fp32, which
would otherwise be half of an int8 step. Its fp32 weight stays readable as `lm_head.weight` (heads copy
its rows; for a tied head it is the embedding, which a step reads by rows and is never quantized).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger(__name__)
GPU_ONLY_FP8 = (
    "fp8 linears (torch._scaled_mm): a GPU-only path no CI run executes (scripts/gpu_check.sh measures it "
    "against the unquantized target)"
)

MODES = ("int8", "int4", "fp8")
INT4_GROUPS = (32, 64, 128, 256)  # qGroupSize values _weight_int4pack_mm_for_cpu accepts
DEFAULT_INT4_GROUP = 128
KERNEL_DEVICES = {
    "int8": "cpu (torch.ops.aten._weight_int8pack_mm)",
    "int4": "cpu (torch.ops.aten._weight_int4pack_mm_for_cpu)",
    "fp8": "cuda with compute capability >= 8.9 (Ada, Hopper, Blackwell: torch._scaled_mm)",
}
ACT = torch.bfloat16  # the CPU kernels' activation, scale and zero dtype (their fast path)


@dataclass(frozen=True)
class QuantSpec:
    mode: str  # int8, int4 or fp8
    group_size: int | None = None  # int4: inputs per scale; None = chosen per model (pick_group_size)

    @property
    def label(self) -> str:
        """What outputs record: int8, int4-g64, fp8."""
        return f"int4-g{self.group_size}" if self.mode == "int4" else self.mode


GROUP_FLAGS = {
    "--quantize": "--group-size",
    "--quantize-draft": "--draft-group-size",
}  # mode flag -> its group's


def parse_quantize(
    mode: str | None, group_size: int | None = None, field: str = "--quantize"
) -> QuantSpec | None:
    """`--quantize MODE` and `--group-size G` -> a QuantSpec (None for no quantization); errors name the
    flags the user set (`--quantize-draft` and `--draft-group-size` for the draft: GROUP_FLAGS)."""
    group_field = GROUP_FLAGS.get(field, "--group-size")
    if mode in (None, "", "none"):
        return None
    if mode not in MODES:
        raise BadInputError(field, mode, f"one of none, {', '.join(MODES)}")
    if group_size is not None and mode != "int4":
        raise BadInputError(
            group_field,
            group_size,
            f"no group size with {field} {mode}",
            "int8 and fp8 scale per output row",
        )
    if group_size is not None and group_size not in INT4_GROUPS:
        raise BadInputError(group_field, group_size, f"one of {INT4_GROUPS} (the int4 CPU kernel's groups)")
    return QuantSpec(mode, group_size)


# ---- the device check -------------------------------------------------------------------------------------
def check_device(spec: QuantSpec, device: torch.device, field: str = "--quantize") -> None:
    """Refuse a quantization this device has no kernel for, naming the devices that have one."""
    if spec.mode == "fp8":
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            raise BadInputError(field, "fp8", "a torch with float8 (torch.float8_e4m3fn, torch._scaled_mm)")
        ok = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
    else:
        ok = device.type == "cpu"
    if not ok:
        raise BadInputError(
            field,
            f"{spec.mode} on {device}",
            f"a device with {spec.mode} kernels: {KERNEL_DEVICES[spec.mode]}",
        )


# ---- the quantized linears --------------------------------------------------------------------------------
def bf16_at_least(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bfloat16, up to the next representable value where rounding went below x (x > 0)."""
    b = x.to(ACT)
    low = b.float() < x
    return torch.where(low, torch.nextafter(b, torch.full_like(b, float("inf"))), b)


class QuantLinear(nn.Module):
    """Base of the quantized linears: keeps in/out features and the bias (fp32) of the linear it replaces.
    `label` names the layout as outputs record it (QuantSpec.label).
    `weight` is an empty tensor of the replaced weight's dtype and device: code that asks a linear for its
    dtype or device (a head sizing its KV cache) still can, code that reads its values fails loudly (the
    LM head is the exception: `keep_weight` keeps the fp32 weight readable, see the module docstring)."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = linear.bias.detach().float().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)
        if keep_weight:
            self.weight = linear.weight  # the same Parameter (tied: the embedding's)
        else:
            self.register_buffer("weight", linear.weight.new_empty(0), persistent=False)
        # what cost proxies read (drafter.count_params, bench roofline.weight_bytes): the replaced weight's
        # parameters, and the bytes a forward reads (the quantized buffers, never a kept fp32 weight)
        self.weights_in_buffers = 0 if keep_weight else self.in_features * self.out_features

    def store_rows(self, qweight: torch.Tensor, scale: torch.Tensor) -> None:
        """The per-output-row layouts (int8, fp8): codes [N, K] and one scale per row [N]."""
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)

    def read_bytes(self) -> int:
        """Bytes a forward reads: the kernel's buffers (not int4's unpacked-order copy nor a kept weight)."""
        kept = self.weight.data_ptr() if self.weights_in_buffers == 0 else None
        buffers = [b for name, b in self.named_buffers() if name != "qnibbles" and b.numel()]
        return sum(b.numel() * b.element_size() for b in buffers if b.data_ptr() != kept)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features)  # [M, K]
        y = self.matmul(flat).to(x.dtype)  # [M, N]
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.describe()}"


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float32 -> (q int8 [N, K] in [-127, 127], s bf16 [N] >= max|w_row| / 127)."""
    scale = bf16_at_least(w.abs().amax(dim=1).clamp_min(1e-30) / 127)  # [N]: covers the row
    return torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8), scale


def fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float32 -> (e4m3 codes [N, K], s fp32 [N] = max|w_row| / 448)."""
    scale = w.abs().amax(dim=1).clamp_min(1e-30) / torch.finfo(torch.float8_e4m3fn).max  # [N]
    return (w / scale[:, None]).to(torch.float8_e4m3fn), scale


class Int8Linear(QuantLinear):
    """W ~= q * s per output row; q int8 in [-127, 127], s bf16 [N] >= max|W_row| / 127."""

    label = "int8"

    def __init__(self, linear: nn.Linear, keep_weight: bool = False):
        super().__init__(linear, keep_weight)
        self.store_rows(*int8_rows(linear.weight.detach().float()))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N] bf16
        return torch.ops.aten._weight_int8pack_mm(x.to(ACT).contiguous(), self.qweight, self.scale)

    def dequantized(self) -> torch.Tensor:  # [N, K] float64: the weight the kernel multiplies by
        return self.qweight.double() * self.scale.double()[:, None]

    def describe(self) -> str:
        return "int8 per channel"


class Int4Linear(QuantLinear):
    """W ~= (q - 8) * s + z per group of `group` inputs; q in [0, 15]; s, z bf16 [N, G]: the zero is
    rounded first and the scale then covers [z - 8 s, z + 7 s] around the group's weights."""

    def __init__(self, linear: nn.Linear, group: int, keep_weight: bool = False):
        super().__init__(linear, keep_weight)
        n, k = linear.weight.shape
        self.group = group
        self.label = f"int4-g{group}"
        w = linear.weight.detach().float().view(n, k // group, group)  # [N, G, g]
        lo, hi = w.amin(-1), w.amax(-1)  # [N, G]
        zero = (lo + 8 * (hi - lo) / 15).to(ACT)  # rounded before the scale is chosen
        z = zero.float()
        span = torch.maximum((hi - z) / 7, (z - lo) / 8).clamp_min(1e-30)
        scale = bf16_at_least(span)  # [N, G]: (w - z) / s in [-8, 7] for every w of the group
        q = torch.round((w - z[..., None]) / scale.float()[..., None] + 8).clamp(0, 15).to(torch.uint8)
        q = q.view(n, k)  # [N, K] in [0, 15]
        self.register_buffer("qnibbles", q[:, ::2] | (q[:, 1::2] << 4))  # [N, K/2]: for dequantized()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zero", torch.stack([scale, zero], -1).transpose(0, 1).contiguous())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N] bf16
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(ACT).contiguous(), self.packed, self.group, self.scale_zero
        )

    def codes(self) -> torch.Tensor:  # [N, K] uint8 in [0, 15]
        lo, hi = self.qnibbles & 15, self.qnibbles >> 4
        return torch.stack([lo, hi], -1).view(self.out_features, self.in_features)

    def dequantized(self) -> torch.Tensor:  # [N, K] float64
        scale, zero = self.scale_zero.double().transpose(0, 1).unbind(-1)  # [N, G] each
        q = self.codes().double().view(self.out_features, -1, self.group)
        return ((q - 8) * scale[..., None] + zero[..., None]).view(self.out_features, self.in_features)

    def describe(self) -> str:
        return f"int4 groups of {self.group}"


class Fp8Linear(QuantLinear):
    """W ~= e4m3(W / s) * s per output row (s fp32 [N] = max|W_row| / 448); activations scaled per row."""

    label = "fp8"

    def __init__(self, linear: nn.Linear, keep_weight: bool = False):
        super().__init__(linear, keep_weight)
        self.store_rows(*fp8_rows(linear.weight.detach().float()))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N] bf16 (CUDA)
        fmax = torch.finfo(torch.float8_e4m3fn).max
        xs = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / fmax  # [M, 1]
        xq = (x.float() / xs).to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            xq, self.qweight.t(), scale_a=xs, scale_b=self.scale[None, :], out_dtype=torch.bfloat16
        )

    def dequantized(self) -> torch.Tensor:  # [N, K] float64
        return self.qweight.double() * self.scale.double()[:, None]

    def describe(self) -> str:
        return "fp8 e4m3 per channel"


def quant_linear(linear: nn.Linear, spec: QuantSpec, keep_weight: bool = False) -> QuantLinear:
    if spec.mode == "int8":
        return Int8Linear(linear, keep_weight)
    if spec.mode == "int4":
        return Int4Linear(linear, spec.group_size, keep_weight)
    return Fp8Linear(linear, keep_weight)


# ---- whole models -----------------------------------------------------------------------------------------
def find_linears(root: nn.Module, prefix: str, skip: set[int] = frozenset()) -> dict[str, nn.Linear]:
    """Qualified name -> nn.Linear under `root`, leaving out linears whose weight's storage is in `skip`."""
    out = {}
    for name, module in root.named_modules(prefix=prefix):
        if type(module) is nn.Linear and module.weight.data_ptr() not in skip:
            out[name] = module
    return out


def pick_group_size(spec: QuantSpec, linears: dict[str, nn.Linear], field: str) -> QuantSpec:
    """int4: the requested group must divide every layer's in_features (exit 2 naming the first that it
    does not); unset, DEFAULT_INT4_GROUP where it divides them all, else the largest kernel group that does
    (SmolLM2's 576 = 9 x 64 inputs: 64)."""
    if spec.mode != "int4":
        return spec
    widths = sorted({lin.in_features for lin in linears.values()})
    if spec.group_size is not None:
        for name, lin in linears.items():
            if lin.in_features % spec.group_size:
                raise BadInputError(
                    GROUP_FLAGS.get(field, "--group-size"),
                    spec.group_size,
                    f"a group size dividing every layer's in_features (those here: {widths})",
                    f"{name} has in_features={lin.in_features}",
                )
        return spec
    order = (DEFAULT_INT4_GROUP, *sorted((g for g in INT4_GROUPS if g < DEFAULT_INT4_GROUP), reverse=True))
    for group in order:
        if all(w % group == 0 for w in widths):
            return QuantSpec("int4", group)
    raise BadInputError(
        field,
        "int4",
        f"layers whose in_features the int4 kernel's groups {INT4_GROUPS} divide",
        f"got {widths}",
    )


def replace_linears(root: nn.Module, prefix: str, linears: dict[str, nn.Linear], spec: QuantSpec, keep=()):
    """Swap each named linear for its quantized version in place (`keep`: names whose weight stays)."""
    for name in linears:
        owner_name, _, attr = name.rpartition(".")
        local = owner_name.removeprefix(prefix).removeprefix(".") if prefix else owner_name
        owner = root.get_submodule(local) if local else root
        setattr(owner, attr, quant_linear(linears[name], spec, keep_weight=name in keep))


def quantize_target(target, spec: QuantSpec, field: str = "--quantize") -> QuantSpec:
    """Quantize the target's decoder-layer linears and its LM head in place; returns the spec used (its
    int4 group chosen). The target keeps its identity: `weights_hash()` is the checkpoint's (a head
    trained against the unquantized target binds to it, as the head never saw the quantized weights),
    and `quantization` records what runs."""
    check_device(spec, target.device, field)
    if target.tp_size > 1:
        raise BadInputError(field, spec.mode, "a target on one device (not tensor parallel)")
    source_hash = target.weights_hash()  # before: it reads the fp32 weights
    layers = find_linears(target.decoder.layers, "layers")
    head = target.model.lm_head
    linears = {**layers, "lm_head": head} if type(head) is nn.Linear else layers
    if not linears:
        raise BadInputError(field, spec.mode, "a target with nn.Linear layers")
    spec = pick_group_size(spec, linears, field)
    replace_linears(target.decoder.layers, "layers", layers, spec)
    if "lm_head" in linears:
        target.model.lm_head = quant_linear(head, spec, keep_weight=True)
    target.source_weights_hash, target.quantization = source_hash, spec.label
    target.model.source_weights_hash = source_hash  # artifacts.weights_hash(model) answers it too
    log.info("target quantized: %s, %d linears (decoder layers and LM head)", spec.label, len(linears))
    if spec.mode == "fp8":
        log.info(GPU_ONLY_FP8)
    return spec


def drafter_modules(drafter, target) -> list[nn.Module]:
    """The modules a drafter's step model holds (a head, a draft model's network), the target's own
    excluded."""
    out = []
    for value in vars(getattr(drafter, "steps", drafter)).values():
        if value is target or value is getattr(target, "model", None):
            continue
        module = value if isinstance(value, nn.Module) else getattr(value, "model", None)
        if isinstance(module, nn.Module) and module is not target.model:
            out.append(module)
    return out


def quantization_of(roots: list[nn.Module], skip: nn.Module | None = None) -> str | None:
    """The weight quantization the modules hold, read off their linears ("int8", "int4-g64", "fp8", several
    joined by "+"; None: none); modules of `skip` (the target a head shares layers with) do not count."""
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    modules = (m for root in roots for m in root.modules() if id(m) not in skipped)
    return "+".join(sorted({m.label for m in modules if isinstance(m, QuantLinear)})) or None


def draft_quantization(drafter, target) -> str | None:
    """The drafter's precision, read off its own modules as they are (an int8 folder loads int8 linears,
    quantize_draft swaps them): a fact of the modules, never an attribute written beside them."""
    return quantization_of(drafter_modules(drafter, target), target.model) if drafter is not None else None


def own_linears(drafter, target) -> tuple[list[nn.Module], dict[str, nn.Linear]]:
    """(the drafter's modules, their linears that do not share the target's weights) by name draft{i}.*"""
    target_params = {p.data_ptr() for p in target.model.parameters()}
    roots = drafter_modules(drafter, target) if drafter is not None else []
    found: dict[str, nn.Linear] = {}
    for i, root in enumerate(roots):
        found.update(find_linears(root, f"draft{i}", target_params))
    return roots, found


def quantize_draft(drafter, target, spec: QuantSpec, draft: str = "", field: str = "--quantize-draft"):
    """Quantize the drafter's own linears (a head's, a draft LM's), never one that shares the target's
    weights (the target's embedding or LM head a head reads); the drafter's proposals change, the output
    law does not (the target verifies). Returns the spec used."""
    if drafter is None:
        raise BadInputError(field, spec.mode, "a --draft with a model (a head or a draft LM)")
    roots, found = own_linears(drafter, target)
    if not found:
        raise BadInputError(
            field,
            f"{spec.mode} for --draft {draft or drafter.name}",
            "a drafter with weights of its own (a trained head, model:TARGET)",
            "ngram has none; self:layers=N runs the target's own layers, which --quantize quantizes",
        )
    device = next(iter(found.values())).weight.device
    check_device(spec, device, field)
    spec = pick_group_size(spec, found, field)
    for i, root in enumerate(roots):
        mine = {n: lin for n, lin in found.items() if n.split(".", 1)[0] == f"draft{i}"}
        replace_linears(root, f"draft{i}", mine, spec)
    log.info("draft quantized: %s, %d linears", spec.label, len(found))
    if spec.mode == "fp8":
        log.info(GPU_ONLY_FP8)
    return spec
