"""The helpers several head kinds (runtime/heads/*_kind.py) call; what a kind declares, and the types its
functions take and return, are runtime/heads/head_kind.py's.

    read_any = lazy_function("draftsmith.runtime.heads.dflash_layout", "load_dflash")  # imported when called
    def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
        head = load_head(folder)
        return write_checked(out, head, to_speculators(head), read_any, "speculators", details(head))

- `lazy_class` and `lazy_function`: a kind names its head's module without importing it with the registry;
- `write_checked`: a layout's files written, read back as `--draft` reads them, compared with the head, and
  reported; `checked_export` the comparison and the report alone (for a writer that writes its own files);
- `serve_speculators`: the serve text of a speculators folder (EAGLE-3, P-EAGLE and DFlash write one).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from draftsmith.runtime.core.artifacts import atomic_save_file, check_round_trip
from draftsmith.runtime.errors import DraftsmithError
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, WEIGHTS_FILE
from draftsmith.runtime.heads.head_kind import ServeArgs, Written


def lazy_class(module: str, name: str) -> Callable[[], type]:
    """A kind's `module_class`: `module.name`, imported when asked (the registry stays light)."""
    return lambda: getattr(importlib.import_module(module), name)


def lazy_function(module: str, name: str) -> Callable:
    """`module.name`, imported at each call: a kind's reader without importing its head with the kind."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


def write_checked(
    out: Path,
    head,
    layout: tuple[dict, dict],
    read: Callable,
    what: str,
    details: list[str],
    expected: dict | None = None,
    precision: str = "",
) -> Written:
    """Write a layout (config.json and model.safetensors: `layout`, as a kind's converter returns them) into
    `out`, read it back with `read` (as `--draft` does) and compare with `head` (or with `expected`: an FP8
    export's dequantized tensors) -> what was written, with the layout's `details`."""
    config, tensors = layout
    with open(out / CONFIG_FILE, "w") as f:
        f.write(json.dumps(config, indent=1) + "\n")
    atomic_save_file(out / WEIGHTS_FILE, tensors, {"format": "pt"})
    back = read(str(out))
    return checked_export(back, head, tensors, what, details, expected, precision)


def checked_export(
    back, head, tensors: dict, what: str, details: list[str], expected=None, precision="", whose="head's"
) -> Written:
    """An export read back (`back`) must hold `expected` (default: the head's state dict) exactly and the
    head's config (`whose`: the head's name in the error) -> what was written: the head's config, the
    written `tensors` sized, the layout's `details` and a quantized export's `precision`."""
    expected = head.state_dict() if expected is None else expected
    check_round_trip(expected, back.state_dict(), f"{what} export")
    if asdict(back.config) != asdict(head.config):
        raise DraftsmithError(f"{what} export: the config read back differs from the {whose}")
    return Written.of_head(head.config, tensors, details, precision=precision)


def serve_speculators(args: ServeArgs, note: str = "") -> str:
    """The serve text of a speculators folder: vLLM reads the verifier from it (`note`: how it drafts)."""
    return (
        f"## Serve\n\nvLLM (reads the verifier from `speculators_config`{note}):\n\n"
        f"```bash\nvllm serve {args.repo}\n```\n\ndraftsmith:\n\n{args.generate}"
    )
