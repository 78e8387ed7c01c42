"""`draftsmith eval`'s sets read through `datasets.load_dataset` by Hub id (runtime/bench/eval_sets.py,
`hub_rows`), with no network: `load_dataset` is replaced by one that checks the Hub id, config, split and
revision it is asked for and returns a real `datasets.Dataset` built from the set's local fixture (the Hub
schema, tests/fixtures/eval_sets/). The prompts must equal those the offline folder gives from the same rows,
the pin must name the Hub read; a failed Hub read and HF_HUB_OFFLINE say where to put a local file.

    python -m pytest tests/runtime/test_eval_sets_hub.py -q
"""

import json
from pathlib import Path

import datasets
import pytest

from draftsmith.runtime.bench.eval_sets import load_eval_set
from draftsmith.runtime.errors import BadInputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets"
REVISION = "0123abcd"
# spec -> (the fixture holding its rows, the (path, config, split, revision) load_dataset must be asked for)
HUB = {
    "speed-bench": ("speed-bench__qualitative.jsonl", ("nvidia/SPEED-Bench", "qualitative", "test", None)),
    f"speed-bench/throughput_2k@{REVISION}": (
        "speed-bench__throughput_2k.jsonl",
        ("nvidia/SPEED-Bench", "throughput_2k", "test", REVISION),
    ),
    "gsm8k": ("gsm8k__main.jsonl", ("openai/gsm8k", "main", "test", None)),
    "mt-bench": ("mt-bench.jsonl", ("HuggingFaceH4/mt_bench_prompts", None, "train", None)),
    "math-500": ("math-500.jsonl", ("HuggingFaceH4/MATH-500", None, "test", None)),
    "mbpp": ("mbpp__full.jsonl", ("google-research-datasets/mbpp", "full", "test", None)),
    "mbpp/sanitized": ("mbpp__full.jsonl", ("google-research-datasets/mbpp", "sanitized", "test", None)),
}
SANITIZED = {"text": "prompt"}  # the sanitized config names the task `prompt` (the full config: `text`)


def fake_hub(monkeypatch, fixture: str, expected: tuple) -> list:
    """load_dataset -> the fixture's rows as a datasets.Dataset, once the arguments are the expected ones;
    returns the list of calls seen."""
    calls = []

    def load_dataset(path, name=None, *, split=None, revision=None, **kwargs):
        calls.append((path, name, split, revision))
        assert (path, name, split, revision) == expected and not kwargs, (path, name, split, revision, kwargs)
        rows = [json.loads(line) for line in (FIXTURES / fixture).read_text().splitlines() if line.strip()]
        if name == "sanitized":
            rows = [{SANITIZED.get(k, k): v for k, v in row.items()} for row in rows]
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


@pytest.fixture(autouse=True)
def online(monkeypatch, tmp_path):
    """A machine with (pretend) network and no local copy of any set."""
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("DRAFTSMITH_EVAL_SETS", str(tmp_path / "no-local-copies"))


@pytest.mark.parametrize("spec", sorted(HUB))
def test_a_set_read_from_the_hub_gives_the_prompts_its_local_copy_gives(spec, monkeypatch):
    fixture, expected = HUB[spec]
    calls = fake_hub(monkeypatch, fixture, expected)
    prompts, pin = load_eval_set(spec, num_prompts=50)
    assert len(calls) == 1
    assert pin["source"] == "hub" and "file" not in pin
    assert (pin["hub_id"], pin["config"], pin["split"], pin["revision"]) == expected
    from_file, file_pin = load_eval_set(f"{spec.partition('@')[0]}:{FIXTURES / fixture}", num_prompts=50)
    assert prompts == from_file and len(prompts) >= 2
    assert pin["prompts_hash"] == file_pin["prompts_hash"]
    if not spec.endswith("sanitized"):  # the same rows (the sanitized config's are renamed)
        assert pin["rows_hash"] == file_pin["rows_hash"]


def test_a_failed_hub_read_says_where_to_put_a_local_file(monkeypatch, tmp_path):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(BadInputError) as err:
        load_eval_set("gsm8k", num_prompts=4)
    text = str(err.value)
    assert "the Hub read failed" in text and "Couldn't reach" in text
    assert str(tmp_path / "no-local-copies" / "gsm8k.jsonl") in text and err.value.exit_code == 2


def test_offline_never_calls_the_hub(monkeypatch):
    calls = fake_hub(monkeypatch, "gsm8k__main.jsonl", ("openai/gsm8k", "main", "test", None))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BadInputError, match="offline"):
        load_eval_set("gsm8k", num_prompts=4)
    assert calls == []
