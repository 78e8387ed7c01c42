"""Where `--tree adaptive:K,survival=SOURCE` reads its survival estimates (runtime/verify/adaptive.py):
`observed` ignores the drafter's own, `confidence` asks for a confidence head and is refused (exit code 2,
naming the kinds that have one) for a draft without one, in `generate` and `bench`, while a DSpark head
serves it (the control); a tree shape after K, which a per-row prefix cannot truncate, and an unknown
source exit 2 too.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_adaptive_survival.py -q
"""

import json
from dataclasses import replace

import pytest
import torch
from dspark_heads import random_head

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.verify.adaptive import AdaptiveVerify
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.load_aware import VerifyCosts
from draftsmith.runtime.verify.tree import chain


def test_observed_survival_ignores_the_drafters_estimates():
    costs = VerifyCosts({1: [1.0, 1.2, 1.4, 1.6]})
    sure = DraftBatch.from_drafts([Draft(chain(3), [5, 6, 7, 8])], "cpu")
    sure = replace(sure, survival=torch.ones(1, 4))  # every node predicted accepted: all three pay
    assert AdaptiveVerify(costs, 3).budget(sure, 1).max_depth == 3
    # the observed prior (1/2 per position): node 2 adds 1.75 / 1.4 = 1.25, no better than node 1's 1.5 / 1.2
    assert AdaptiveVerify(costs, 3, "observed").budget(sure, 1).max_depth == 1


@pytest.fixture(scope="module")
def dspark_folder(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dspark-survival") / "head"
    random_head(tiny_target, block=4).save_pretrained(folder)
    return folder


def generate(tiny_dir, capsys, *extra):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "4"]
    code = main([*argv, *extra])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("draft", "tree", "says"),
    [
        ("ngram", "adaptive:2,survival=confidence", "dspark:DIR"),  # no confidence head: which kinds have
        ("self:layers=1", "adaptive:2,survival=confidence", "survival=confidence with a draft that has"),
        ("ngram", "adaptive:2,dynamic:depth=2,topk=2,tokens=4", "cannot be truncated"),  # a tree shape
        ("ngram", "adaptive:static:[[0]]", "adaptive:K[,survival="),
        ("ngram", "adaptive:2,survival=maybe", "survival= one of auto, confidence, observed"),
    ],
)
def test_bad_survival_requests_exit_2(tiny_dir, capsys, draft, tree, says):
    code, err = generate(tiny_dir, capsys, "--draft", draft, "--tree", tree)
    assert code == 2 and "--tree" in err and says in err, err


def test_a_confidence_head_serves_survival_confidence(tiny_dir, dspark_folder, capsys):
    for source in ("confidence", "observed"):  # the control: the same request of a head that has one
        code, err = generate(
            tiny_dir, capsys, "--draft", f"dspark:{dspark_folder}", "--tree", f"adaptive:2,survival={source}"
        )
        assert code == 0, err


def test_bench_refuses_survival_confidence_without_a_confidence_head(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2"}))
    argv = [
        "bench",
        "--target",
        str(tiny_dir),
        "--draft",
        "ngram",
        "--tree",
        "adaptive:2,survival=confidence",
    ]
    argv += [
        "--baselines",
        "plain",
        "--no-roofline",
        "--prompts",
        f"jsonl:{prompts}",
        "--out",
        str(tmp_path / "b"),
    ]
    assert main(argv) == 2
    assert "dspark:DIR" in capsys.readouterr().err


def test_the_policy_follows_where_survival_comes_from(tiny_target, dspark_folder):
    """A confidence head's per-row estimates exist only after drafting: the cut comes after it. Observed
    rates are known before drafting: the depth is chosen then (load-aware), drafting nothing unverified."""
    from draftsmith.runtime.speculator import SpecConfig, build_speculator
    from draftsmith.runtime.verify.load_aware import LoadAwareDepth

    cases = [
        (f"dspark:{dspark_folder}", "auto", AdaptiveVerify),
        (f"dspark:{dspark_folder}", "observed", LoadAwareDepth),
    ]
    cases += [("ngram", "auto", LoadAwareDepth)]
    for draft, source, policy in cases:
        cfg = SpecConfig(draft, f"adaptive:2,survival={source}", batch_sizes=[1]).validate()
        assert isinstance(build_speculator(tiny_target, cfg).policy(1), policy), (draft, source)
