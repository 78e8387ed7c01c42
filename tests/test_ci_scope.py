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


def test_ci_runs_the_interop_checks_and_none_is_skipped():
    """Issue 46: `.ci/run` runs `make interop` after `make test`; every check is a step whose failure fails
    the run (no `|| true`, no skip), llama.cpp and vLLM both."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make test") < ci.index("make interop")
    assert "bash scripts/interop.sh" in (ROOT / "Makefile").read_text()
    script = (ROOT / "scripts" / "interop.sh").read_text()
    steps = re.findall(r"^\s*step (\S+) (.+)$", script, re.M)
    commands = " ".join(command for _, command in steps)
    for check in (
        "setup_llamacpp.sh",
        "vllm_env",
        "check_llamacpp.py",
        "check_vllm.sh eagle3",
        "check_vllm.sh peagle",
        'check_vllm.sh "$kind"',
        "check_vllm.sh dflash",
        "check_vllm.sh dspark",
    ):
        assert check in commands, check
    loop = re.search(r"^for kind in (.+); do$", script, re.M)
    assert loop and set(loop.group(1).split()) == {"medusa", "mtp"}
    for kind in ("medusa", "mtp", "dflash"):  # each with its shipped head
        assert (ROOT / "heads" / f"{kind}-smollm2-135m" / "config.json").is_file(), kind
    assert "|| true" not in script and "continue" not in script
    assert 'exit "$FAILED"' in script
