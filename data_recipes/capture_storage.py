"""How a capture stores hidden states: the storage dtypes (fp8 with per-token scales among them), the
tensors a shard holds for each, bytes per token and the disk estimate `data capture` prints first.

    storage = Storage.of("fp8", num_aux=3, hidden_size=576)         # aux fp8, last hidden bfloat16
    storage.bytes_per_token()                                        # 2897
    storage.encode("aux_hidden", x)   # {"aux_hidden": e4m3fn [T, A*H], "aux_hidden_scale": f32 [T, A]}
    decode(handle, "aux_hidden", 0, 10, "fp8", torch.bfloat16)       # [10, A*H] bfloat16

`--storage-dtype fp8` stores the aux states (what the head's fc reads) as float8_e4m3fn with one float32
scale per token and aux layer (data_recipes/fp8.py has the math and its error bound), and the last hidden
state in bfloat16: the target's logits, hence the soft labels, come from it. `--fp8-last-hidden` stores
that one in fp8 too (one scale per token). `--fp8-bf16-layers 1` keeps the named aux layers (ids from
--aux-layers) in bfloat16: the shallowest layer has the largest fp8 round-trip error (2.2% RMS against
0.5-0.9% for the deeper ones on SmolLM2, BENCHMARKS.md), so it buys back the most per byte. Per token, for
A aux layers of width H, k of them kept in bfloat16:

    bfloat16 / float16 / float32   (A+1)*H*w + 5                     w = 2, 2, 4 bytes
    fp8                            A*H + 4A + 2H + 5                 8B (H=4096): 20,497 B (32,773 bf16)
    fp8 + --fp8-bf16-layers (k)    (A-k)*H + 4(A-k) + 2kH + 2H + 5   8B, k=1: 24,589 B
    fp8 + --fp8-last-hidden        A*H + 4A + H + 4 + 5              8B: 16,405 B

(+5: the int32 id and int8 mask; rows add 16 bytes each for offsets and row_index.) Shard tensors for
fp8 add `aux_hidden_scale float32 [N, A]` (and `last_hidden_scale float32 [N, 1]`); with k layers kept,
`aux_hidden` holds the other A-k layers [N, (A-k)*H] (scales [N, A-k]) and `aux_hidden_bf16` bfloat16
[N, k*H] the kept ones, both in aux-layer order; a read puts them back in place: [N, A*H].

    python -m draftsmith.data_recipes.capture_storage       # the disk table in BENCHMARKS.md
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.data_recipes import fp8
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith.data_recipes.capture")

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STORAGE_DTYPES = (*TORCH_DTYPES, "fp8")
FP8_LAST_DEFAULT = "bfloat16"  # the last hidden state's storage when the aux states are fp8
SCALE = "_scale"  # shard tensor `NAME_scale` holds NAME's fp8 scales
KEPT = "_bf16"  # shard tensor `aux_hidden_bf16` holds the aux layers --fp8-bf16-layers keeps in bfloat16
ROW_BYTES = 16  # int64 offsets + int64 row_index per row


def check_storage(storage_dtype, fp8_last_hidden: bool = False, bf16_layers=(), aux_layers=None) -> None:
    """Refuse an unknown storage dtype, fp8 on a torch without float8 dtypes, --fp8-last-hidden or
    --fp8-bf16-layers without fp8, and kept layers that are not aux layers (when those are known)."""
    if storage_dtype not in STORAGE_DTYPES:
        raise BadInputError("--storage-dtype", storage_dtype, f"one of {list(STORAGE_DTYPES)}")
    if storage_dtype == "fp8" and not fp8.available():
        raise BadInputError(
            "--storage-dtype",
            "fp8",
            f"one of {list(TORCH_DTYPES)} on this torch ({torch.__version__} has no torch.{fp8.FP8_NAME})",
            "fp8 captures need torch >= 2.1",
        )
    if fp8_last_hidden and storage_dtype != "fp8":
        raise BadInputError(
            "--fp8-last-hidden",
            True,
            "--storage-dtype fp8 with it (it stores the last hidden state in fp8 too)",
        )
    if bf16_layers:
        check_bf16_layers(storage_dtype, bf16_layers, aux_layers)


def check_bf16_layers(storage_dtype: str, bf16_layers, aux_layers=None) -> None:
    """--fp8-bf16-layers: distinct ids, with fp8, each one of the aux layers, not all of them."""
    layers = list(bf16_layers)
    if storage_dtype != "fp8":
        raise BadInputError(
            "--fp8-bf16-layers", layers, "--storage-dtype fp8 with it (it keeps some aux layers in bfloat16)"
        )
    if len(set(layers)) != len(layers) or not all(isinstance(i, int) and i >= 0 for i in layers):
        raise BadInputError("--fp8-bf16-layers", layers, "distinct 0-based layer ids from --aux-layers")
    if aux_layers is not None:
        outside = [i for i in layers if i not in aux_layers]
        if outside:
            raise BadInputError("--fp8-bf16-layers", layers, f"ids among the aux layers {list(aux_layers)}")
        if len(layers) == len(aux_layers):
            raise BadInputError(
                "--fp8-bf16-layers",
                layers,
                "fewer ids than aux layers",
                "for no fp8 at all: --storage-dtype bfloat16",
            )


def parse_bf16_layers(text: str | None) -> list[int]:
    """`--fp8-bf16-layers 1,14` -> [1, 14]; None or '' -> []."""
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise BadInputError("--fp8-bf16-layers", text, "comma-separated layer ids, e.g. 1 or 1,14") from None


def kept_positions(aux_layers, bf16_layers) -> tuple[int, ...]:
    """Positions (in aux-layer order) of the layers kept in bfloat16."""
    return tuple(list(aux_layers).index(i) for i in sorted(bf16_layers, key=list(aux_layers).index))


@dataclass(frozen=True)
class Storage:
    """Storage dtype names of aux_hidden and last_hidden, the widths they cover, and the aux positions
    kept in bfloat16 under fp8 (`kept`, in aux-layer order)."""

    aux: str
    last: str
    num_aux: int
    hidden_size: int
    kept: tuple[int, ...] = ()

    @classmethod
    def of(cls, storage_dtype: str, num_aux: int, hidden_size: int, fp8_last_hidden: bool = False, kept=()):
        last = "fp8" if fp8_last_hidden else FP8_LAST_DEFAULT if storage_dtype == "fp8" else storage_dtype
        return cls(storage_dtype, last, num_aux, hidden_size, tuple(kept))

    def dtype_of(self, name: str) -> str:
        return self.aux if name == "aux_hidden" else self.last

    def groups(self, name: str) -> int:
        # one fp8 scale per aux layer stored in fp8, per token
        return self.num_aux - len(self.kept) if name == "aux_hidden" else 1

    def bytes_per_token(self) -> int:
        total = 4 + 1 + 2 * len(self.kept) * self.hidden_size  # int32 id, int8 mask, kept layers bf16
        for name, width in (
            ("aux_hidden", (self.num_aux - len(self.kept)) * self.hidden_size),
            ("last_hidden", self.hidden_size),
        ):
            dtype = self.dtype_of(name)
            if dtype == "fp8":
                total += width + fp8.SCALE_BYTES * self.groups(name)
            else:
                total += width * torch.empty((), dtype=TORCH_DTYPES[dtype]).element_size()
        return total

    def describe(self) -> str:
        """What a token stores, for the estimate line: '4 x 576 bfloat16 values' or the fp8 split."""
        if self.aux != "fp8":
            return f"{self.num_aux + 1} x {self.hidden_size} {self.aux} values"
        n, k = self.num_aux - len(self.kept), len(self.kept)
        return (
            f"{n} x {self.hidden_size} fp8 aux values + {n} float32 scales, "
            + (f"{k} x {self.hidden_size} bfloat16 aux values, " if k else "")
            + f"{self.hidden_size} {self.last} last{' + 1 scale' if self.last == 'fp8' else ''}"
        )

    def tensor_names(self) -> list[str]:
        names = []
        for name in ("aux_hidden", "last_hidden"):
            names += [name, name + SCALE] if self.dtype_of(name) == "fp8" else [name]
        return names + (["aux_hidden" + KEPT] if self.kept else [])

    def _split_kept(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, A*H] -> (the fp8 layers [T, (A-k)*H], the kept layers [T, k*H]), aux order within each."""
        layers = x.reshape(x.shape[0], self.num_aux, -1)  # [T, A, H]
        rest = [i for i in range(self.num_aux) if i not in self.kept]
        return layers[:, rest].flatten(1), layers[:, list(self.kept)].flatten(1)

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x [T, D] (any float dtype, any device) -> the CPU tensors a shard stores for it. Raises
        ValueError for non-finite values (fp8: in the input; others: after the cast, e.g. fp16 overflow)."""
        dtype = self.dtype_of(name)
        x = x.detach().to("cpu")
        if dtype == "fp8":
            if not torch.isfinite(x).all():  # a NaN or inf amax would poison the token's scale
                raise ValueError(f"non-finite {name} ({int((~torch.isfinite(x)).sum())} values) in fp8")
            kept = {}
            if name == "aux_hidden" and self.kept:
                x, hi = self._split_kept(x)  # [T, (A-k)*H], [T, k*H]
                kept = {name + KEPT: hi.to(torch.bfloat16)}
                if not torch.isfinite(kept[name + KEPT]).all():
                    raise ValueError(f"non-finite {name} in bfloat16")
            values, scales = fp8.quantize(x, self.groups(name))  # [T, D] e4m3fn, [T, G] float32
            return {name: values, name + SCALE: scales, **kept}
        stored = x.to(TORCH_DTYPES[dtype])
        if not torch.isfinite(stored).all():
            hint = " (float16 overflows on large activations; use bfloat16 or float32)" * (dtype == "float16")
            raise ValueError(f"non-finite {name} in {dtype}{hint}")
        return {name: stored}

    def record_tensors(self) -> dict[str, str]:
        """The `tensors` entry of the step record for the hidden states."""
        a, h = self.num_aux, self.hidden_size
        out = {
            "aux_hidden": f"{_on_disk(self.aux)} [N, {a}*{h}] in aux_layers order",
            "last_hidden": f"{_on_disk(self.last)} [N, {h}] pre-norm; logits = lm_head(norm(.))",
        }
        if self.aux == "fp8" and self.kept:
            k = len(self.kept)
            out["aux_hidden"] = (
                f"{fp8.FP8_NAME} [N, {a - k}*{h}] the aux layers not kept, in aux_layers order"
            )
            out["aux_hidden_bf16"] = (
                f"bfloat16 [N, {k}*{h}] aux positions {list(self.kept)} (fp8_bf16_layers)"
            )
        if self.aux == "fp8":
            out["aux_hidden_scale"] = (
                f"float32 [N, {a - len(self.kept)}] per token and fp8 aux layer; x = aux_hidden * scale"
            )
        if self.last == "fp8":
            out["last_hidden_scale"] = "float32 [N, 1] per token; x = last_hidden * scale"
        return out


def bytes_per_token(
    num_aux: int, hidden_size: int, storage_dtype: str, fp8_last_hidden: bool = False, kept=()
) -> int:
    """Bytes a captured token takes (tensors only): what the estimate before a capture multiplies."""
    return Storage.of(storage_dtype, num_aux, hidden_size, fp8_last_hidden, kept).bytes_per_token()


def _on_disk(dtype: str) -> str:
    return fp8.FP8_NAME if dtype == "fp8" else dtype


def decode(
    handle, name: str, start: int, end: int, storage_dtype: str, dtype: torch.dtype | None = None, kept=()
):
    """Rows start:end of tensor `name` from an open safetensors shard: [T, D] in `dtype` (fp8: dequantized,
    float32 when dtype is None, the aux positions `kept` in bfloat16 put back in place; others: as stored
    when None)."""
    values = handle.get_slice(name)[start:end]
    if storage_dtype != "fp8":
        return values if dtype is None else values.to(dtype)
    out = fp8.dequantize(values, handle.get_slice(name + SCALE)[start:end], dtype or torch.float32)
    if not kept:
        return out
    hi = handle.get_slice(name + KEPT)[start:end]  # [T, k*H] bfloat16
    rows, k = out.shape[0], len(kept)
    width = hi.shape[1] // k
    layers = torch.empty(rows, out.shape[1] // width + k, width, dtype=out.dtype)  # [T, A, H]
    rest = [i for i in range(layers.shape[1]) if i not in kept]
    layers[:, rest] = out.reshape(rows, -1, width)
    layers[:, list(kept)] = hi.reshape(rows, k, width).to(out.dtype)
    return layers.flatten(1)


def capture_bytes(rows: int, tokens: int, storage: Storage) -> int:
    """Bytes a capture of `rows` rows and `tokens` tokens takes (tensors only, shard headers aside)."""
    return tokens * storage.bytes_per_token() + ROW_BYTES * rows


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_disk(out: Path, lengths, start_row: int, kept: int, storage: Storage) -> None:
    """Log the rows, tokens and bytes to go (`lengths`: of the rows to go); refuse when they do not fit."""
    todo_tokens = sum(lengths)
    estimate = capture_bytes(len(lengths), todo_tokens, storage)
    log.info(
        "capture: %d rows, %d tokens%s; about %s on disk (%d bytes/token: %s + id + mask)",
        len(lengths),
        todo_tokens,
        f" to go (resuming after row {start_row}, {kept} shard(s) kept)" if kept else "",
        human_bytes(estimate),
        storage.bytes_per_token(),
        storage.describe(),
    )
    free = shutil.disk_usage(out).free
    if estimate > free:
        raise BadInputError(
            "--out",
            f"{human_bytes(free)} free on its disk",
            f"about {human_bytes(estimate)} for this capture",
            "free some space, pick another folder, or capture fewer rows",
        )


# The targets of the disk table: (name, hidden size, decoder layers); 3 aux layers as EAGLE-3 takes.
TABLE_TARGETS = (("SmolLM2-135M", 576, 30), ("Llama-3.1-8B", 4096, 32), ("Llama-3.3-70B", 8192, 80))
# (storage dtype, last hidden in fp8, aux positions kept in bfloat16)
STORAGE_CHOICES = (("bfloat16", False, ()), ("fp8", False, ()), ("fp8", False, (0,)), ("fp8", True, ()))


def disk_table(conversations: int = 100_000, tokens_each: int = 2048, num_aux: int = 3) -> list[dict]:
    """Bytes per token and capture size per target and storage choice (the function the CLI estimates
    with), for `conversations` rows of `tokens_each` tokens."""
    rows = []
    for name, hidden, _layers in TABLE_TARGETS:
        for dtype, last_fp8, kept in STORAGE_CHOICES:
            storage = Storage.of(dtype, num_aux, hidden, last_fp8, kept)
            total = capture_bytes(conversations, conversations * tokens_each, storage)
            label = "fp8 (all)" if last_fp8 else "fp8 (aux), bf16 last" if dtype == "fp8" else dtype
            label = "fp8 (aux but the first), bf16 first + last" if kept else label
            rows.append(
                {
                    "target": name,
                    "hidden": hidden,
                    "storage": label,
                    "bytes_per_token": storage.bytes_per_token(),
                    "bytes": total,
                }
            )
    return rows


if __name__ == "__main__":
    print("| target | H | storage | bytes/token | 100k x 2048 tokens |")
    print("|---|---|---|---|---|")
    for r in disk_table():
        size = human_bytes(r["bytes"])
        print(f"| {r['target']} | {r['hidden']} | {r['storage']} | {r['bytes_per_token']:,} | {size} |")
