"""The one speculation builder (runtime/speculator.py): SpecConfig's checks before any target loads, and
build_speculator's speculators decoding the tiny target as plain decoding does.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_speculator.py -q
"""

import pytest

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.speculator import DraftProcess, SpecConfig, build_speculator
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 9, 10, 11, 9]]


def test_the_tree_a_config_builds_with():
    assert SpecConfig("ngram").tree_spec() is None  # the drafter's default
    assert SpecConfig("ngram", "auto:3").tree_spec() == chain(3)  # the deepest the policy may draft
    assert SpecConfig("ngram", "chain:3").tree_spec() == chain(3)
    assert SpecConfig("ngram", ssd=True).tree_spec() == chain(2)  # SSD's chain: the draft's default depth
    assert SpecConfig("ngram", "auto:3").auto_depth == 3 and SpecConfig("ngram").auto_depth is None


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (SpecConfig("none", ssd=True), "--draft"),
        (SpecConfig("ngram", "auto:2", ssd=True), "--tree"),
        (SpecConfig("ngram", "static:binary-3", ssd=True), "--tree"),
        (SpecConfig("ngram", static=True, draft_process=DraftProcess("smollm2-135m")), "--cuda-graphs"),
        (SpecConfig("ngram", "chain:3", ssd=True, ssd_fanout=3), "--ssd-fanout"),
        (SpecConfig("ngram", ssd=True, ssd_saguaro=0.0), "--ssd-saguaro"),
        (SpecConfig("ngram", draft_process=DraftProcess("smollm2-135m", device="cuda:9")), "--draft-device"),
        (SpecConfig("ngram", "auto:99"), "--tree"),
        (SpecConfig("ngram", quantize_draft="int4", draft_group_size=7), "--draft-group-size"),
    ],
)
def test_bad_configs_name_the_flag_before_any_target_loads(cfg, field):
    with pytest.raises(BadInputError, match=f"^{field}: got "):
        cfg.validate()


def test_speculators_decode_as_plain_decoding(tiny_target):
    greedy = SamplingParams()
    plain = build_speculator(tiny_target, SpecConfig().validate())
    assert plain.drafter is None and plain.policy(1) is None
    want = [r.token_ids for r in plain.generate(PROMPTS, greedy, max_new_tokens=12, batch_size=2)]
    for cfg in (
        SpecConfig("ngram", "chain:2"),
        SpecConfig("self:layers=1", "auto:2", batch_sizes=[1, 2]),
        SpecConfig("self:layers=1", "chain:2", ssd=True, ssd_fanout=4),
    ):
        speculator = build_speculator(tiny_target, cfg.validate())
        got = speculator.generate(PROMPTS, greedy, max_new_tokens=12, batch_size=2)
        assert [r.token_ids for r in got] == want, cfg
        metrics = speculator.finish()
        assert (len(metrics) == 1 and len(speculator.trace) > 0) if cfg.ssd else metrics == [], cfg
    assert speculator.max_depth is None
    auto = build_speculator(tiny_target, SpecConfig("self:layers=1", "auto:2", batch_sizes=[1, 2]))
    auto.generate(PROMPTS, greedy, max_new_tokens=12, batch_size=2)
    assert auto.max_depth == 2 and sum(auto.policies[2].depth_counts) > 0  # one policy per batch size
    auto.reset()
    assert auto.policies == {}


def test_draft_quantization_is_refused_or_skipped_without_weights(tiny_target):
    cfg = SpecConfig("ngram", "chain:2", quantize_draft="int8")
    with pytest.raises(BadInputError, match="^--quantize-draft: got "):
        build_speculator(tiny_target, cfg)
    cfg.weightless_ok = True  # bench: a drafter without weights of its own runs as it is
    assert build_speculator(tiny_target, cfg).draft_quantization is None
