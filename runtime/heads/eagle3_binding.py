"""A co-trained EAGLE-3 head's binding to its target (train/objectives/eagle3_cotrain.py writes it).

    check_bound_target(head.config, target)                    # exit 2 unless target's weights hash matches
    check_bound_target(head.config, original, any_target=True) # told: pair them anyway (a warning)
    check_export_target(head.config, options.verifier, "--verifier", options.any_target)   # export

A head trained with its target co-trained reads that target's features: its config names the co-trained
folder (`target`, the run's final/target) and records its weights hash (runtime/core/artifacts.py
`weights_hash`, what MTP and Medusa-2 heads record). Loading it against other weights, the original target
included, is bad input (exit 2), as for MTP and Medusa-2 heads; unlike those, an EAGLE-3 head can be
paired with another target on purpose (`--draft eagle3:DIR#any-target`, `export --any-target`): drafts
stay verified, so decoding stays lossless, only acceptance changes. A head that was not co-trained records
no hash and is checked by vocabulary, sizes and tokenizer alone (runtime/heads/eagle3.py).
Tests: tests/train/test_eagle3_cotrain.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftsmith.runtime.core.targets import folder_weights_hash  # noqa: F401 (re-exported: mtp_kind, tests)
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")


def check_bound_target(config, target, any_target: bool = False) -> None:
    """A co-trained head (`target_weights_hash` set) against `target`'s weights."""
    if config.target_weights_hash is None:
        return
    got = target.weights_hash()
    if got == config.target_weights_hash:
        return
    if any_target:
        log.warning(
            "eagle3 head: co-trained with %s (weights %s), paired with %s (weights %s) as asked: lossless, "
            "acceptance may be lower",
            config.target,
            config.target_weights_hash,
            target.name,
            got,
        )
        return
    raise BadInputError(
        "eagle3 head target_weights_hash",
        config.target_weights_hash,
        f"{got} of the target {target.name}",
        f"pass --target {config.target} (this head was co-trained with its own target), or "
        "--draft eagle3:DIR#any-target to pair it with this target anyway",
    )


def check_export_target(
    config, named: str | None, flag: str, any_target: bool = False, head_folder: Path | None = None
) -> None:
    """An export of a co-trained head names its target (`--verifier` or `--target`; by default the head
    folder's own `target/`, else the folder its config names, which a relative output_dir makes relative
    to where training ran): it must be on this machine and hash to the head's binding, unless told."""
    if config.target_weights_hash is None:
        return
    from draftsmith.runtime.core.targets import local_target_folder

    shipped = Path(head_folder) / "target" if head_folder is not None else None
    where = named or (str(shipped) if shipped is not None and shipped.is_dir() else config.target)
    folder = local_target_folder(where, config.target_weights_hash) or local_target_folder(where)
    got = folder_weights_hash(folder) if folder is not None else None
    if got == config.target_weights_hash:
        return
    if any_target:
        log.warning("export: a co-trained head exported for %s (weights %s), as asked", where, got)
        return
    found = f"its weights hash is {got}" if folder is not None else "it is not on this machine"
    raise BadInputError(
        flag,
        where,
        f"the target the head was co-trained with ({config.target}, weights {config.target_weights_hash})",
        f"{found}; pass --any-target to export it for this target anyway",
    )


def binding_details(config) -> list[str]:
    """The model card's line for a co-trained head (none for a head trained against a frozen target)."""
    if config.target_weights_hash is None:
        return []
    return [
        f"co-trained target: serve with {config.target} (weights {config.target_weights_hash}); "
        "draftsmith refuses another target unless told (--draft eagle3:DIR#any-target)"
    ]
