"""scripts/regenerated_to_jsonl.py, the self-distilled recipe's bridge: a regenerated folder written as JSONL
and prepared again as a training source gives the same rows in the same splits (ids, token ids, masks)
as the regenerated folder itself, so a train run on it learns the target's own answers.

    OMP_NUM_THREADS=1 python -m pytest tests/data_recipes/test_regenerated_jsonl.py -q
"""

import json

import datasets
from repo_files import load_repo_file

from draftsmith.data_recipes import regenerate as regen
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.verify.sampling import SamplingParams


def load_script():
    return load_repo_file("scripts/regenerated_to_jsonl.py")


def rows_by_split(folder):
    ds = datasets.load_from_disk(str(folder))
    return {s: {r["id"]: (r["input_ids"], r["loss_mask"]) for r in ds[s]} for s in ds}


def test_the_jsonl_prepares_into_the_regenerated_rows(tiny_target, tmp_path):
    source = tmp_path / "conv.jsonl"
    convs = [
        [
            {"role": "user", "content": f"w{i} w{i + 1}"},
            {"role": "assistant", "content": f"w{i + 2} w{i + 3}"},
        ]
        for i in range(1, 60, 3)
    ]
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs))
    options = dict(max_length=256, validation_fraction=0.3, progress=False)
    prepare(tiny_target, str(source), tmp_path / "prepared", **options)
    regen.regenerate(
        tiny_target,
        tmp_path / "prepared",
        tmp_path / "regen",
        SamplingParams(),
        max_new_tokens=5,
        progress=False,
    )
    out = tmp_path / "regen.jsonl"
    script = load_script()
    rows = script.conversations(tmp_path / "regen")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare(tiny_target, str(out), tmp_path / "again", **options)
    want, got = rows_by_split(tmp_path / "regen"), rows_by_split(tmp_path / "again")
    assert set(want) == set(got) == {"train", "validation"} and want["validation"]
    assert got == want
    original = rows_by_split(tmp_path / "prepared")
    assert {s: set(v) for s, v in original.items()} == {s: set(v) for s, v in got.items()}  # same splits
    assert original != got  # the control: the answers did change (they are the target's now)
