"""The one strict reader of head folders, shared by every kind (runtime/heads/head_kinds.py lists them).

    config, tensors = read_head_folder("runs/x/final", "eagle3", Eagle3Config)   # files, head_type, keys
    head = fill_strict(Eagle3Head(config), tensors, "EAGLE-3", config.draft_vocab_size)   # names, shapes

`read_head_folder` refuses a folder without both config.json and model.safetensors, one whose config.json
names another `head_type` (saying which), and one whose keys are not the config class's fields (besides
`trained_for`, the record runtime/heads/trained_for.py writes and checks).
`fill_strict` loads tensors into a built module: every tensor it expects present with its exact shape,
nothing extra, floats finite (runtime/core/artifacts.check_tensors), derived buffers (`rotary.*`) never
stored, values cast to the module's dtypes, and its draft-vocabulary map (d2t/t2d) valid. The engine
layouts' readers (layouts.py, medusa_layout.py, dflash_layout.py, peagle_kind.py) rename their tensors to
ours first and end in `fill_strict` too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from draftsmith.runtime.core.artifacts import check_tensors, load_tensors, validate_draft_vocab
from draftsmith.runtime.errors import BadInputError, read_json

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
TRAINED_FOR = (
    "trained_for"  # config.json's record of the data it was trained on (runtime/heads/trained_for.py)
)
DERIVED = ("rotary.",)  # buffers a head rebuilds from its config: never stored, never expected


def read_head_folder(folder: str | Path, kind: str, config_class: type) -> tuple:
    """A draftsmith folder of a `kind` head -> (its config_class config, its tensors {name: tensor}),
    strictly read."""
    folder = Path(folder)
    what = f"{kind} head"
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise BadInputError(what, str(folder), f"a folder with {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = read_json(folder / CONFIG_FILE, what)
    check_head_type(raw, kind)
    return config_from(raw, config_class, folder / CONFIG_FILE), load_tensors(folder / WEIGHTS_FILE, what)


def check_head_type(raw: dict, kind: str) -> None:
    """config.json says `head_type: KIND`; another kind's folder (or an engine's) is named as what it is."""
    if raw.get("head_type") == kind:
        return
    got = raw.get("head_type") or raw.get("speculators_model_type") or raw.get("architectures") or None
    hint = f"this folder holds a {got} head: --draft {got}:DIR" if isinstance(got, str) else None
    raise BadInputError("head_type", got, f"{kind} (a draftsmith {kind} head folder)", hint)


def config_from(raw: dict, config_class: type, where: str | Path):
    """config_class(**raw), a key it does not have (or a missing one) named as the file's error; the
    `trained_for` record is not a config field (it is read and checked where the head is served)."""
    raw = {key: value for key, value in raw.items() if key != TRAINED_FOR}
    try:
        return config_class(**raw)
    except TypeError as err:
        expected = f"the {config_class.__name__} fields"
        raise BadInputError(str(where), sorted(raw), expected, str(err)) from None


def fill_strict(
    module: nn.Module,
    tensors: dict[str, torch.Tensor],
    what: str,
    draft_vocab: int | None = None,
    absent: tuple[str, ...] = (),
) -> nn.Module:
    """`tensors` (our names) into `module`, strictly; `draft_vocab`: check its d2t/t2d for that many draft
    ids; `absent`: tensors a layout may leave out (kept as built: DFlash's identity map at full vocabulary).
    -> the module in eval mode."""
    expected = {k: v for k, v in module.state_dict().items() if not k.startswith(DERIVED) and k not in absent}
    check_tensors(expected, tensors, what)
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in tensors.items()}, strict=False)
    if draft_vocab is not None:
        validate_draft_vocab(module.d2t, module.t2d, module.config.vocab_size, draft_vocab)
    return module.eval()
