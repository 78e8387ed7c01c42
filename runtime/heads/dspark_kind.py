"""The DSpark head kind: what runtime/heads/head_kinds.py registers for `dspark` (runtime/heads/head_kind.py
says what a kind declares).

    head, options = KIND.load_draft("runs/dspark/final", target)           # --draft dspark:DIR
    head, options = KIND.load_draft("runs/dspark/final#block=4", target)   # {"block": 4}: a smaller block
    KIND.all_layouts()["speculators"].write(head_folder, out, LayoutOptions(verifier="org/model"))

The head is runtime/heads/dspark.py (a DFlash backbone, a Markov head, a confidence head), its drafter
runtime/drafters/dspark_drafter.py, its speculators layout runtime/heads/dspark_layout.py; this file holds
the `head:` section of a train config (the objective is train/objectives/dspark_objective.py) and the export
writer. `--draft`'s options and trees are DFlash's (`#block=N`, `cartesian:K1,..`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import dflash_kind
from draftsmith.runtime.heads.dflash_kind import DFlashSection
from draftsmith.runtime.heads.dspark import DEFAULT_RANK, MARKOV_TYPES, check_markov
from draftsmith.runtime.heads.head_kind import HeadKind, Layout
from draftsmith.runtime.heads.kind_parts import lazy_class, lazy_function, serve_speculators, write_checked

if TYPE_CHECKING:  # the layout functions' annotations
    from draftsmith.runtime.heads.head_kind import LayoutOptions, Written


@dataclass
class DSparkSection(DFlashSection):
    """`head:` of a DSpark train config (configs/dspark-smollm2-135m.yaml): DFlash's keys (the backbone and
    its distillation loss) plus the Markov head's and the two extra loss terms' weights."""

    type: Literal["dspark"] = "dspark"  # type: ignore[assignment]
    markov_rank: int = DEFAULT_RANK  # r of the Markov bias: in [1, draft_vocab_size]
    markov_head_type: str = "vanilla"  # one of MARKOV_TYPES
    tvd_weight: float = 1.0  # the total variation distance term, weighted per position as the distillation
    confidence_weight: float = 1.0  # the confidence head's BCE (speculators' confidence_head_alpha)

    def validate(self) -> DSparkSection:
        super().validate()
        check_markov(self.markov_rank, self.markov_head_type, self.draft_vocab_size, "head.")
        for key in ("tvd_weight", "confidence_weight"):
            if not getattr(self, key) >= 0:
                raise BadInputError(f"head.{key}", getattr(self, key), "a number >= 0")
        return self

    def head_options(self) -> dict:
        return {**super().head_options(), **self.keywords("markov_rank", "markov_head_type")}


def draft_arg(arg: str) -> tuple[str, dict]:
    """`DIR` or `DIR#block=N` -> (DIR, the drafter's {"block": N or None (the trained block)})."""
    folder, sep, size = arg.partition(dflash_kind.BLOCK_OPTION)
    if not sep:
        return arg, {"block": None}
    if not size.isdigit():
        raise BadInputError("--draft", f"dspark:{arg}", "dspark:DIR or dspark:DIR#block=N with an integer N")
    return folder, {"block": int(size)}


def default_depth(arg: str) -> int | None:
    return dflash_kind.default_depth(draft_arg(arg)[0])


read_any = lazy_function("draftsmith.runtime.heads.dspark_layout", "load_dspark")


def _details(c) -> list[str]:
    """The model card's lines about a head with config `c`."""
    return [
        *dflash_kind._details(c),
        f"Markov head: {c.markov_head_type}, rank {c.markov_rank}; a confidence head (per-position survival)",
    ]


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.heads.dspark import load_head
    from draftsmith.runtime.heads.dspark_layout import to_speculators

    head = load_head(folder)
    layout = to_speculators(head, options.verifier)
    return write_checked(out, head, layout, read_any, "speculators", _details(head.config))


KIND = HeadKind(
    name="dspark",
    title="DSpark block drafter",
    about="a DSpark block drafter (DFlash + Markov and confidence heads): our folder or its speculators "
    f"export; dspark:DIR#block=N drafts a smaller block (Markov heads: {', '.join(MARKOV_TYPES)})",
    module_class=lazy_class("draftsmith.runtime.heads.dspark", "DSparkHead"),
    section=DSparkSection,
    read=read_any,
    draft_arg=draft_arg,
    spec="dspark:DIR[#block=N]",
    layouts={
        "speculators": Layout(
            write=write_speculators,
            serve=partial(serve_speculators, note="; DSpark drafts a block per forward"),
            reads="verifier",
            about="speculators' DSpark layout (speculators_model_type: dspark)",
        ),
    },
    default_depth=default_depth,
    parse_tree=dflash_kind.parse_tree,
    confidence=True,
)
