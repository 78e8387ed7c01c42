"""The registry of head kinds: the one place that maps a head kind's name to what it declares.

    kind = head_kinds.get("mtp")                    # HeadKind (runtime/heads/head_kind.py): module, section,
    ...
    head_kinds.draft_kind("eagle3:runs/x/final")    # (KIND, "runs/x/final") for a --draft spec, else None
    head_kinds.parse_tree("medusa:runs/m/final", "sparse:15")   # --tree, read by the kind when it has trees
    head_kinds.of_folder("runs/x/final")            # the kind a head folder's config.json names
    head_kinds.formats()                            # export layout -> the kinds it fits

Adding a kind: write its files (module, step model, a `runtime/heads/NAME_kind.py` declaring its
`HeadKind`) and add it to KINDS below; its drafter is registered the same way in
runtime/drafters/registry.py and its training objective in train/objectives/registry.py. No other module
tests a kind's name: `--draft`, `export --format`, train configs' `head.type` and model
cards all look it up here. This module imports no trainer (tests/test_imports.py).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.dflash_kind import KIND as DFLASH
from draftsmith.runtime.heads.dspark_kind import KIND as DSPARK
from draftsmith.runtime.heads.eagle3_kind import KIND as EAGLE3
from draftsmith.runtime.heads.head_kind import DEFAULT_DEPTH, HeadKind, HeadSection
from draftsmith.runtime.heads.medusa_kind import KIND as MEDUSA
from draftsmith.runtime.heads.mtp_kind import KIND as MTP
from draftsmith.runtime.heads.peagle_kind import KIND as PEAGLE

KINDS: dict[str, HeadKind] = {  # one each
    kind.name: kind for kind in (EAGLE3, MTP, MEDUSA, PEAGLE, DFLASH, DSPARK)
}
DEFAULT_KIND = EAGLE3.name  # a train config without head.type


def get(name: str, field: str = "head.type") -> HeadKind:
    if name not in KINDS:
        raise BadInputError(field, name, f"one of {', '.join(KINDS)}")
    return KINDS[name]


def draft_kind(spec: str) -> tuple[HeadKind, str] | None:
    """`NAME:ARG` with a registered NAME and a non-empty ARG -> (kind, ARG); anything else None."""
    name, sep, arg = spec.partition(":")
    if sep and arg and name in KINDS:
        return KINDS[name], arg
    return None


def draft_specs() -> tuple[str, ...]:
    """The `--draft` forms of the head kinds (for help texts and errors)."""
    return tuple(kind.spec for kind in KINDS.values())


def default_depth(spec: str) -> int:
    """The default chain depth for a `--draft` spec: 2, or fewer where the head drafts fewer."""
    found = draft_kind(spec)
    depth = found[0].default_depth(found[1]) if found else None
    return DEFAULT_DEPTH if depth is None else depth


def parse_tree(draft: str, tree: str):
    """`--tree TREE` for `--draft DRAFT` -> a TreeSpec: the kind's own reading where it has one (Medusa's
    cartesian:/sparse:), else runtime/tree.parse_tree_spec."""
    from draftsmith.runtime.verify.tree import parse_tree_spec

    found = draft_kind(draft)
    if found is not None and found[0].parse_tree is not None:
        return found[0].parse_tree(found[1], tree)
    return parse_tree_spec(tree)


def of_folder(folder: str | Path, field: str = "CHECKPOINT") -> HeadKind | None:
    """The kind a draftsmith head folder's config.json names (`head_type`); None when it names none."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return None
    return KINDS.get(read_json(config, field).get("head_type"))


def formats() -> dict[str, tuple[str, ...]]:
    """Export layout name -> the kinds it fits, in registration order (`draftsmith` fits every kind)."""
    out: dict[str, tuple[str, ...]] = {}
    for kind in KINDS.values():
        for name in kind.all_layouts():
            out[name] = (*out.get(name, ()), kind.name)
    return out


def section_class(data, key: str = "head") -> type[HeadSection]:
    """The `head:` section class for a train config's (partial) `head` mapping, chosen by its `type`;
    a key that belongs to another kind's section is refused naming that kind."""
    name = data.get("type", DEFAULT_KIND) if isinstance(data, dict) else DEFAULT_KIND
    section = get(name, f"{key}.type").section
    own = set(section.__dataclass_fields__)
    for field in data if isinstance(data, dict) else ():
        owners = [k.name for k in KINDS.values() if field in k.section.__dataclass_fields__]
        if field not in own and owners:
            raise BadInputError(
                f"{key}.{field}",
                data[field],
                f"a key of a {key}.type={name} section ({', '.join(sorted(own))})",
                f"{field} is an option of {key}.type={' or '.join(owners)}",
            )
    return section
