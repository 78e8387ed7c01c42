"""Which drafter runs a loaded head: the drafters' side of the head-kind registry.

    head, options = kind.load_draft("runs/mtp/final#recursive", target)      # runtime/heads/*_kind.py
    drafter = head_drafter(kind.name, head, target, tree, options)          # its step model, grown

A head kind registers twice: its kind (runtime/heads/head_kinds.py: files, layouts, what `--draft
NAME:ARG` loads) and here its drafter, so heads never import drafters. Each factory takes the head on the
target's device and dtype, the target, the tree and the options its kind's `load_draft` returned.
"""

from __future__ import annotations

from draftsmith.runtime.drafters.dflash_drafter import dflash_drafter
from draftsmith.runtime.drafters.dspark_drafter import dspark_drafter
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.drafters.medusa_drafter import medusa_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter

HEAD_DRAFTERS = {
    "eagle3": eagle3_drafter,
    "peagle": peagle_drafter,
    "mtp": mtp_drafter,
    "medusa": lambda heads, target, tree: medusa_drafter(target, heads, tree),
    "dflash": lambda head, target, tree, block=None: dflash_drafter(target, head, tree, block),
    "dspark": lambda head, target, tree, block=None: dspark_drafter(target, head, tree, block),
}


def head_drafter(kind: str, head, target, tree, options: dict) -> ModelDrafter:
    return HEAD_DRAFTERS[kind](head, target, tree, **options)
