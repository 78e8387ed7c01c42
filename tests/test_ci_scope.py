"""What `make test` (and so CI) runs: the multi-process tests are in it, and DeepSpeed is installed so its
ZeRO-2/3 tests run rather than skip (issue 47: every scale path checked on every fresh clone).

    python -m pytest tests/test_ci_scope.py -q
"""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def test_the_default_selection_keeps_the_distributed_tests():
    addopts = re.search(r"^addopts = (.+)$", PYPROJECT, re.M).group(1)
    assert "-m 'not slow and not gpu'" in addopts and "distributed" not in addopts, addopts
    assert '"distributed: starts several processes"' in PYPROJECT  # the marker still names them


def test_deepspeed_is_in_what_make_test_installs():
    dev = re.search(r"^dev = \[(.+?)\]$", PYPROJECT, re.M | re.S).group(1)
    assert '"deepspeed"' in dev, dev
    assert importlib.util.find_spec("deepspeed") is not None  # installed here: the ZeRO tests do not skip
