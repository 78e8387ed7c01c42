"""Shared fixtures: a tiny random target folder (tests/tiny_models.py) and the embedded SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest
from family_models import FAMILY_NAMES, make_family_dir
from tiny_models import make_tiny_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_target(tiny_dir):
    from draftsmith.runtime.core.target import Target

    return Target.load(str(tiny_dir), device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    from draftsmith.runtime.core.target import Target

    return Target.load("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    """One tiny sharded folder per new family (tests/family_models.py), built once, read-only to tests."""
    root = tmp_path_factory.mktemp("families")
    return {name: make_family_dir(root / name, name) for name in FAMILY_NAMES}
