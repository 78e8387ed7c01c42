"""runtime/verify/near_tie.py: the first mismatch between a run and plain decoding, and
whether the target's logits there are within rounding of a tie. Negative controls: a genuine wrong token
and a run that stopped early are never near-ties; a planted exact tie is one."""

import math

import pytest
import torch
from engine_checks import make_prompts
from tiny_models import tiny_model, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.verify.near_tie import first_mismatch, next_logits, tie_tolerance
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def plain_run(target, prompt, n=12):
    return generate_plain(target, [prompt], GREEDY, max_new_tokens=n)[0].token_ids


def test_tolerance_is_a_few_ulp_of_the_dtype_at_the_logits_magnitude():
    assert tie_tolerance(20.0, torch.float32) == pytest.approx(4 * 2**-23 * 16)  # 7.6e-6: HF's 1e-5 scale
    assert tie_tolerance(20.0, torch.bfloat16) == 0.5
    assert tie_tolerance(-20.0, torch.bfloat16) == 0.5
    assert tie_tolerance(0.01, torch.bfloat16) == 4 * 2**-7  # below 1: the ulp at 1


def test_identical_runs_have_no_mismatch(target):
    prompt = make_prompts(1)[0]
    want = plain_run(target, prompt)
    assert first_mismatch(target, prompt, list(want), want) is None


def test_a_wrong_token_is_not_a_near_tie(target):
    """The runner-up in place of plain decoding's token at step 3: the gap is the target's top-2 margin,
    measured independently with the transformers model, and far above fp32's tolerance."""
    prompt = make_prompts(1)[0]
    want = plain_run(target, prompt)
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + want[:3]])).logits[0, -1].float()  # [V]
    top2 = logits.topk(2)
    assert top2.indices[0].item() == want[3]
    got = want[:3] + [top2.indices[1].item()] + want[4:]
    mismatch = first_mismatch(target, prompt, got, want)
    assert (mismatch.position, mismatch.got, mismatch.want) == (3, got[3], want[3])
    assert mismatch.gap == pytest.approx((top2.values[0] - top2.values[1]).item(), abs=1e-4)
    assert mismatch.gap > 100 * mismatch.tolerance and not mismatch.near_tie
    assert mismatch.as_dict()["near_tie"] is False


def test_a_run_that_stopped_early_is_not_a_near_tie(target):
    prompt = make_prompts(1)[0]
    want = plain_run(target, prompt)
    mismatch = first_mismatch(target, prompt, want[:5], want)
    assert (mismatch.position, mismatch.got, mismatch.want) == (5, None, want[5])
    assert math.isinf(mismatch.gap) and not mismatch.near_tie
    assert mismatch.as_dict()["logit_gap"] is None


def tied_target():
    """A tiny target where token b has the lm_head row of plain decoding's token a at step 2, so the two
    tie there (a wins: the first index) -> (target, prompt, plain tokens, b)."""
    model = tiny_model("llama")
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie before editing
    target = Target(model, tiny_tokenizer(), "tiny")
    prompt = make_prompts(1)[0]
    want = plain_run(target, prompt)
    a = want[2]
    b = next(t for t in range(a + 1, target.vocab_size) if t not in want)  # after a: a stays the argmax
    with torch.no_grad():
        model.lm_head.weight[b] = model.lm_head.weight[a]
    assert plain_run(target, prompt)[:3] == want[:3]  # a still wins step 2 (the first index of a tie)
    return target, prompt, want, b


def test_a_planted_exact_tie_is_a_near_tie():
    """A run that chose b at the tie made no error."""
    target, prompt, want, b = tied_target()
    logits = next_logits(target, prompt + want[:2])
    assert logits[want[2]] == logits[b] == logits.max()
    mismatch = first_mismatch(target, prompt, want[:2] + [b] + want[3:], want)
    assert mismatch.gap == 0.0 and mismatch.near_tie


def test_bench_judges_each_mismatch_and_reports_near_ties_apart():
    """bench.greedy_fields on one conversation of two turns: a tie flipped at turn 0 (its turn-1 prompt
    then differs, so turn 1 takes turn 0's verdict) is reported as near-ties only, marked `~`; a wrong token
    is a mismatch, marked `!` and named in the report."""
    from draftsmith.runtime.bench import compare as bench
    from draftsmith.runtime.bench import report as bench_report

    target, prompt, want, b = tied_target()
    plain = bench.GroupRun(1.0, prompts={(0, 0): prompt, (1, 0): prompt + want})
    plain_reqs = [((0, 0, 0), want, 1.0, None), ((0, 1, 0), want, 1.0, None)]

    def fields(turn0: list[int], turn1: list[int]) -> dict:
        run = bench.GroupRun(1.0, prompts={(0, 0): prompt, (1, 0): prompt + turn0})
        reqs = [((0, 1, 0), turn1, 1.0, None), ((0, 0, 0), turn0, 1.0, None)]  # any order
        assert plain.prompts[0, 0] == run.prompts[0, 0]
        return bench.greedy_fields(reqs, plain_reqs, [run], target)

    tie = fields(want[:2] + [b] + want[3:], want[1:] + want[:1])
    assert tie["greedy_identical"] is False and tie["greedy_near_ties_only"] is True
    first, second = tie["greedy_mismatches"]
    assert (first["turn"], first["first_mismatch_pos"], first["logit_gap"]) == (0, 2, 0.0)
    assert second["turn"] == 1 and second["after_earlier_turn"] and second["near_tie"]
    runner_up = next_logits(target, prompt + want[:3]).topk(2).indices[1].item()
    wrong = fields(want[:3] + [runner_up] + want[4:], want)
    assert wrong["greedy_near_ties_only"] is False
    assert wrong["greedy_mismatches"][0]["logit_gap"] > 0.1
    assert bench.greedy_fields(plain_reqs, plain_reqs, [plain], target) == {
        "greedy_identical": True, "greedy_mismatches": []}  # fmt: skip
    base = {"temperature": 0.0, "batch_size": 1, "tokens_per_s": 1.0, "speedup_vs_plain": 1.0,
            "ttft_ms": {"median": None}, "tpot_ms": {"median": None}}  # fmt: skip
    rows = [{**base, "method": "tied", **tie}, {**base, "method": "wrong", **wrong}]
    assert [bench_report.greedy_mark(r) for r in rows] == ["~", "!"]
    table = bench_report.format_table(rows)
    assert "near-ties only (2 requests)" in table and "**NO** (1 mismatching requests)" in table


CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("spec", ["chain:4", "dynamic:depth=3,topk=2,tokens=6"])
def test_bf16_speculative_decoding_is_greedy_identical_up_to_near_ties(device, static, spec, capsys):
    """EAGLE-3 drafting in bf16 (a random head; eager, and the static path: CUDA graphs on a GPU) against
    plain decoding in bf16, 8 prompts at batch 4: every request is identical, or its first mismatch is a
    near-tie of the target's logits; the gaps are printed either way. bf16 does produce such
    mismatches here (on this CPU 2 to 4 of 8 requests, gaps 0 to 0.5 against a tolerance of 0.5 to 1)."""
    target = Target(tiny_model("llama").to(device, torch.bfloat16), tiny_tokenizer(), "tiny-bf16")
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2]))
    head = head.to(device, torch.bfloat16).eval()
    prompts = make_prompts(8)
    want = generate_plain(target, prompts, GREEDY, max_new_tokens=32, batch_size=4)
    drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
    got = generate_speculative(target, drafter, prompts, GREEDY, 32, batch_size=4, static=static)
    found = [first_mismatch(target, p, g.token_ids, w.token_ids) for p, g, w in zip(prompts, got, want)]
    found = [m.as_dict() for m in found if m is not None]
    line = f"{device} bf16 {spec} static={static}: {len(found)} of {len(prompts)} differ: {found}"
    if device == "cuda":  # into scripts/gpu_check.sh's log; on CPU only when the test fails
        with capsys.disabled():
            print("\n" + line)
    else:
        print(line)
    assert all(m["near_tie"] for m in found), found
