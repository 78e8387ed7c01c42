"""The registry of training objectives, one per head kind (runtime/heads/head_kinds.py registers the kinds;
their objectives are registered here so the runtime never imports the trainer).

    kind = objective(cfg.head.type)(cfg, target, aux_layers, paths)   # what the loop trains
    (train/objectives/heads.py)

An objective class states its kind's name (`kind`), builds `model` (forward(**batch(rows, device)) ->
(loss, correct [D], counted [D])), `batch`, `save_final`, and what the memory preflight reads (`label`,
`steps_label`, `ttt`, `memory_terms(shapes, knobs, setup)` (its bytes per rank beyond the resident ones,
which train/preflight/estimate.py adds; written in the kind's `*_memory.py`), `steps(cfg)`, `new_head(...)`).
Adding a kind: its objective in its own file (and its memory terms), one entry in OBJECTIVES.
"""

from __future__ import annotations

from draftsmith.runtime.errors import DraftsmithError
from draftsmith.runtime.heads import head_kinds
from draftsmith.train.objectives.dflash_objective import DFlashKind
from draftsmith.train.objectives.dspark_objective import DSparkKind
from draftsmith.train.objectives.heads import Eagle3Kind, MtpKind
from draftsmith.train.objectives.medusa_objective import MedusaKind
from draftsmith.train.objectives.peagle_objective import PEagleKind

# one entry per kind
OBJECTIVES: dict[str, type] = {
    cls.kind: cls for cls in (Eagle3Kind, MtpKind, MedusaKind, PEagleKind, DFlashKind, DSparkKind)
}


def objective(name: str) -> type:
    """The objective class of head kind `name` (a registered kind: head.type was checked on load)."""
    head_kinds.get(name)
    if name not in OBJECTIVES:
        raise DraftsmithError(
            f"head.type={name}: no training objective is registered (train/objectives/registry.py)"
        )
    return OBJECTIVES[name]
