"""Import a repository file that is not in a package (scripts/*.py, a worker) by its path, for tests.

from tests.repo_files import load_repo_file
script = load_repo_file("scripts/studies/fp8_vs_bf16.py")
"""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_repo_file(relative: str):
    """The module at REPO/relative, executed once per call under its file's stem."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
