"""The transformers releases that draftsmith's split targets are tested with, and the refusal outside them.

    check_transformers()            # exit 2 on a release outside TESTED, naming the range
    check_transformers("5.26.0")    # the same for a given version string (the tests' way in)

Splitting a target over ranks (runtime/core/placement.py) hands transformers our own device meshes and
reads its tensor- and expert-parallel plans (`base_model_tp_plan`, `base_model_ep_plan`, the `all_reduce`
EP implementation). Those moved between minor releases (5.25 took the experts out of the TP plan; 5.28
removes the old `moe_tp_experts` style), so a release this project has not run is refused up front rather
than split wrongly. pyproject.toml's range is the same one: bump both together after running
`python -m pytest -m distributed tests/train` on the new release.
"""

from __future__ import annotations

from draftsmith.runtime.errors import BadInputError

TESTED = ((5, 24), (5, 25))  # (major, minor) releases the distributed tests ran on


def tested_range() -> str:
    """The range as pip writes it: >=5.24,<5.26."""
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED[0], TESTED[-1]
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"


def check_transformers(version: str | None = None) -> None:
    """Raise BadInputError (exit 2) when `version` (default: the installed transformers) is outside TESTED."""
    from packaging.version import InvalidVersion, Version

    if version is None:
        import transformers

        version = transformers.__version__
    try:
        release = Version(version).release[:2]
    except InvalidVersion:
        release = ()
    if release not in TESTED:
        raise BadInputError(
            "transformers",
            version,
            f"a release in {tested_range()} (the range whose tensor- and expert-parallel plans are tested)",
            f"pip install 'transformers{tested_range()}'",
        )
