"""The drafter in its own process over gloo (runtime/drafters/draft_process.py): two processes on CPU.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_draft_process.py -q -m distributed

- greedy identity with zero mismatches (remote drafter alone, remote SSD);
- at temperature > 0 the remote SSD run (drafting every branch, not stopped by the verdict) is token for
  token the in-process SSD run with the same seed (the same drafts and laws crossed the process boundary;
  the law itself is proven in tests/runtime/test_ssd.py);
- a drafter process killed mid-generation: a DraftProcessError, or with a fallback the same greedy tokens;
- bad input: a draft device that does not exist, a feature head.
"""

import pytest
from engine_checks import assert_identical, make_prompts

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.draft_process import (
    DraftConfig,
    DraftProcessError,
    RemoteDrafter,
    check_draft_device,
    check_process_spec,
)
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.ssd import SsdDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain

pytestmark = pytest.mark.distributed
GREEDY = SamplingParams()
PROMPTS = make_prompts(3)


@pytest.fixture(scope="module")
def plain(tiny_target):
    return generate_plain(tiny_target, PROMPTS, GREEDY, max_new_tokens=20)


def run_remote(target, config, params=GREEDY, drafter_cls=RemoteDrafter, **kw):
    drafter = drafter_cls(config, **kw)
    try:
        return generate_speculative(target, drafter, PROMPTS, params, 20, seed=3), drafter.close()
    finally:
        if drafter.process is not None:
            drafter.close(kill=True)


@pytest.mark.parametrize(("draft", "fanout"), [("self:layers=1", 0), ("self:layers=1", 5), ("ngram", 4)])
def test_greedy_identity(tiny_target, tiny_dir, plain, draft, fanout):
    results, metrics = run_remote(tiny_target, DraftConfig(str(tiny_dir), draft, 2, fanout))
    assert_identical(results, plain)
    assert len(metrics) == len(PROMPTS)
    assert all(m["target_idle_s"] > 0 for m in metrics)
    if fanout and draft != "ngram":
        assert sum(m["hits"] for m in metrics) > 0


def test_sampled_remote_equals_in_process(tiny_target, tiny_dir):
    params = SamplingParams(temperature=1.5, top_k=5)
    config = DraftConfig(str(tiny_dir), "self:layers=1", 2, 5, interrupt=False)  # all branches: reproducible
    remote, _ = run_remote(tiny_target, config, params)
    local = SsdDrafter(lambda tree: lm_drafter(tiny_target, tree, num_layers=1), 2, 5)
    here = generate_speculative(tiny_target, local, PROMPTS, params, 20, seed=3)
    assert [r.token_ids for r in remote] == [r.token_ids for r in here]
    assert [r.accepted_lengths for r in remote] == [r.accepted_lengths for r in here]


class DyingDrafter(RemoteDrafter):
    """Kills its drafter process before the third cycle."""

    cycles = 0

    def propose(self, contexts, tree=None):
        self.cycles += 1
        if self.cycles == 3 and self.process is not None:
            self.process.kill()
            self.process.wait()
        return super().propose(contexts, tree)


def test_dying_drafter_is_a_clear_error(tiny_target, tiny_dir):
    with pytest.raises(DraftProcessError, match="drafter process"):
        run_remote(tiny_target, DraftConfig(str(tiny_dir), "self:layers=1", 2, 5), drafter_cls=DyingDrafter)


def test_dying_drafter_falls_back_in_process(tiny_target, tiny_dir, plain):
    def fallback():
        return lm_drafter(tiny_target, chain(2), num_layers=1)

    results, metrics = run_remote(
        tiny_target,
        DraftConfig(str(tiny_dir), "self:layers=1", 2, 5),
        drafter_cls=DyingDrafter,
        fallback=fallback,
    )
    assert_identical(results, plain)
    assert metrics[-1]["fell_back"]


def test_bad_inputs():
    with pytest.raises(BadInputError, match="--draft-device"):
        check_draft_device("cuda:7")
    with pytest.raises(BadInputError, match="--draft-device"):
        check_draft_device("tpu")
    with pytest.raises(BadInputError, match="--draft"):
        check_process_spec("eagle3:runs/x")
    assert check_draft_device("cpu") == "cpu"


def test_batch_rows_finishing_at_different_cycles(tiny_target, tiny_dir):
    prompts = make_prompts(5, seed=4)
    want = generate_plain(tiny_target, prompts, GREEDY, max_new_tokens=20)
    drafter = RemoteDrafter(DraftConfig(str(tiny_dir), "self:layers=1", 2, 5))
    try:
        got = generate_speculative(tiny_target, drafter, prompts, GREEDY, 20, batch_size=5)
    finally:
        metrics = drafter.close()
    assert_identical(got, want)
    assert len(metrics) == 1 and metrics[0]["lookups"] > 0
