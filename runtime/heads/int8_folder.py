"""int8 CPU heads in draftsmith's own folder layout, for every head kind: written once, loaded by `--draft`.

    save_int8_head(kind, "runs/x/final", "runs/x/final-int8")    # any registered kind's folder
    python -m draftsmith.runtime.heads.int8_folder runs/x/final runs/x/final-int8    # the same
    draftsmith generate --draft eagle3:runs/x/final-int8 ...     # loads as int8, no flag needed

The folder is the kind's own (config.json, model.safetensors, anything else copied as it is) with each
nn.Linear weight `NAME.weight` of the head replaced by `NAME.weight_int8` (int8 [N, K]) and
`NAME.weight_scale` (bf16 [N]): runtime/core/quantize.py's Int8Linear, one scale per output row. config.json
gains `quantization` (method, scheme, the quantized names) and the model card a precision line.

Loading keeps every kind's own strict loader: the int8 weights are dequantized (q * s is exact in fp32:
a 7-bit integer times an 8-bit mantissa) into a temporary copy of the folder, the kind loads its head
from it (names, shapes, the target binding all checked as for any head), and the head's linears are
swapped for Int8Linear modules holding the stored int8 weights and scales bit for bit. The binding is
the unquantized head's: a head trained against one target is refused against another, quantized or not.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from draftsmith.runtime.core.artifacts import atomic_save_file, load_tensors
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.core.quantize import Int8Linear, QuantSpec, check_device
from draftsmith.runtime.errors import DraftsmithError, read_json
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, WEIGHTS_FILE

INT8, SCALE = ".weight_int8", ".weight_scale"


def save_int8_head(kind, folder: str | Path, out: str | Path) -> list[str]:
    """Write `folder` (a head of `kind`, runtime/heads/head_kind.py) as an int8 head into `out`; returns
    the quantized linears' names."""
    folder, out = Path(folder), Path(out)
    module = kind.module.from_pretrained(folder)  # strict: a damaged head is refused here
    tensors = load_tensors(folder / WEIGHTS_FILE, "CHECKPOINT")
    names = [n for n, m in module.named_modules() if type(m) is nn.Linear and f"{n}.weight" in tensors]
    for name in names:
        q = Int8Linear(module.get_submodule(name))
        del tensors[f"{name}.weight"]
        tensors[name + INT8], tensors[name + SCALE] = q.qweight, q.scale
    shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(CONFIG_FILE, WEIGHTS_FILE))
    config = read_json(folder / CONFIG_FILE, "CHECKPOINT")
    config["quantization"] = {
        "method": "int8",
        "scheme": "weight-only, symmetric, one bf16 scale per output row (draftsmith Int8Linear)",
        "quantized": names,
    }
    atomic_save_file(out / WEIGHTS_FILE, tensors, {"format": "pt", "head_type": config.get("head_type", "")})
    atomic_write_text(out / CONFIG_FILE, json.dumps(config, indent=1) + "\n")
    card = out / "README.md"
    if card.is_file():  # the card states the precision under its title
        lines = card.read_text().splitlines(keepends=True)
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
        lines.insert(at, f"\n**Precision: int8 weight-only** ({len(names)} linears, per-row bf16 scales).\n")
        atomic_write_text(card, "".join(lines))
    return names


def write_int8_export(kind, folder: Path, out: Path):
    """`draftsmith export HEAD --quantize int8` (draftsmith layout): the int8 folder of `folder` in `out`,
    read back by the kind's strict loader through its dequantized twin (as `--draft` does) and compared
    with q * s; -> the card's facts (runtime/heads/head_kind.py Written; export writes the card)."""
    from draftsmith.runtime.core.artifacts import check_round_trip, parameter_summary
    from draftsmith.runtime.heads.head_kind import Written

    names = save_int8_head(kind, folder, out)
    tensors = load_tensors(out / WEIGHTS_FILE, "CHECKPOINT")
    config = read_json(out / CONFIG_FILE, "CHECKPOINT")
    back = _dequantized_module(kind, out, config, tensors)
    expected = dict(kind.module.from_pretrained(folder).state_dict())
    for name in names:
        expected[f"{name}.weight"] = (
            tensors[name + INT8].float() * tensors[name + SCALE].float()[:, None]
        ).to(expected[f"{name}.weight"].dtype)
    check_round_trip(expected, back.state_dict(), "int8 export")
    precision = (
        f"int8 weight-only: {len(names)} linears, one bf16 scale per output row (draftsmith Int8Linear)"
    )
    return Written(config["target"], config, parameter_summary(tensors), [], precision=precision)


def _dequantized_module(kind, folder: Path, config: dict, tensors: dict[str, torch.Tensor]):
    """The kind's module loaded (strictly) from a temporary float32 twin of the int8 folder."""
    with dequantized_twin(folder, config, tensors) as twin:
        return kind.module.from_pretrained(twin)


@contextmanager
def dequantized_twin(folder: Path, config: dict, tensors: dict[str, torch.Tensor]):
    """A temporary copy of the int8 folder with q * s float32 weights and no `quantization` entry: what
    the kind's own strict loader reads (runtime/heads/head_folder.py). Yields its path."""
    quant = config["quantization"]
    with tempfile.TemporaryDirectory(prefix="draftsmith-int8-") as tmp:
        twin = Path(tmp) / folder.name
        shutil.copytree(folder, twin, ignore=shutil.ignore_patterns(CONFIG_FILE, WEIGHTS_FILE))
        plain = {k: v for k, v in config.items() if k != "quantization"}
        atomic_write_text(twin / CONFIG_FILE, json.dumps(plain, indent=1) + "\n")
        dense = {n: t for n, t in tensors.items() if not n.endswith((INT8, SCALE))}
        for name in quant["quantized"]:
            dense[f"{name}.weight"] = tensors[name + INT8].float() * tensors[name + SCALE].float()[:, None]
        atomic_save_file(twin / WEIGHTS_FILE, dense, {"format": "pt"})
        yield twin


def int8_config(folder: Path) -> dict | None:
    """The folder's `quantization` entry when it is an int8 folder; None otherwise, a malformed config.json
    included: the kind's own strict loader then says what is wrong with it, naming its field."""
    config = folder / CONFIG_FILE
    try:
        quant = json.loads(config.read_text()).get("quantization") if config.is_file() else None
    except (ValueError, OSError, AttributeError):
        return None
    return quant if isinstance(quant, dict) and quant.get("method") == "int8" else None


def load_draft_head(kind, arg: str, target) -> tuple[torch.nn.Module, dict, str | None]:
    """kind.load_draft, for an int8 folder through its dequantized twin (module docstring) -> the head, its
    drafter's options, and its quantization ("int8" or None)."""
    path, sep, suffix = arg.partition("#")
    folder = Path(path).expanduser()
    quant = int8_config(folder) if folder.is_dir() else None
    if quant is None:
        return (*kind.load_draft(arg, target), None)
    tensors = load_tensors(folder / WEIGHTS_FILE, "--draft")
    config = read_json(folder / CONFIG_FILE, "--draft")
    with dequantized_twin(folder, config, tensors) as twin:
        head, options = kind.load_draft(str(twin) + sep + suffix, target)
    load_stored_int8([head], quant["quantized"], tensors, arg)
    return head, options, "int8"


def load_stored_int8(
    roots: list[nn.Module], names: list[str], tensors: dict[str, torch.Tensor], arg: str
) -> None:
    """Swap the linears `names` of one of `roots` (a head) for Int8Linear modules holding the stored int8
    weights and scales as they are (requantizing q * s could pick another scale where a row's largest |q|
    is 126)."""
    for root in roots:
        try:
            linears = {n: root.get_submodule(n) for n in names}
        except AttributeError:
            continue
        if not all(type(m) is nn.Linear for m in linears.values()):
            break
        check_device(QuantSpec("int8"), next(iter(linears.values())).weight.device, "--draft")
        for name, linear in linears.items():
            module = Int8Linear(linear)
            with torch.no_grad():
                module.qweight.copy_(tensors[name + INT8])
                module.scale.copy_(tensors[name + SCALE])
            owner, _, attr = name.rpartition(".")
            setattr(root.get_submodule(owner) if owner else root, attr, module)
        return
    raise DraftsmithError(f"--draft {arg}: the head has no module with the int8 head's linears {names[:3]}")


def main(argv: list[str] | None = None) -> None:
    """`python -m draftsmith.runtime.heads.int8_folder HEAD OUT`: write HEAD (any kind) as an int8 head."""
    import argparse

    from draftsmith.runtime.errors import BadInputError
    from draftsmith.runtime.heads import head_kinds

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("head", help="a draftsmith head folder (config.json names its head_type)")
    ap.add_argument("out", help="the int8 head folder to write")
    args = ap.parse_args(argv)
    kind = head_kinds.of_folder(args.head, "HEAD")
    if kind is None:
        raise BadInputError(
            "HEAD", args.head, f"a draftsmith head folder of a kind ({', '.join(head_kinds.KINDS)})"
        )
    names = save_int8_head(kind, args.head, args.out)
    print(f"{args.out}: {kind.name} head, {len(names)} linears int8")


if __name__ == "__main__":
    main()
