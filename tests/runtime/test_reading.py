"""The demo's reading of its rows (runtime/bench/reading.py) on hand-made rows: each sentence appears only
when its rows call for it, and the numbers it quotes are the rows' numbers."""

import pytest

from draftsmith.runtime.bench.reading import PUBLISHED, Block, reading, side_by_side, verified_tokens

HEAD = "eagle3:heads/eagle3-smollm2-135m"


def row(method, speedup=1.0, tau=None, draft=None, verify=None, tpot=28.2, rate=30.0):
    return {
        "method": method,
        "tree": method.partition("@")[2] or None,
        "speedup_vs_plain": speedup,
        "mean_accepted": tau,
        "draft_ms_per_cycle": draft,
        "verify_ms_per_cycle": verify,
        "tpot_ms": {"median": tpot, "p90": tpot},
        "tokens_per_s": rate,
    }


def fp32(ngram=0.81, chain=0.43, tree=0.53, curve=None):
    rows = [
        row("plain", 1.0, 1.0, rate=23.5),
        row("hf", 0.65),
        row("ngram@chain:2", ngram, 1.24, 0.05, 32.4),
        row(f"{HEAD}@chain:2", chain, 1.38, 4.7, 35.9),
        row(f"{HEAD}@dynamic:depth=3,topk=4,tokens=8", tree, 1.67, 7.9, 65.5),
    ]
    return Block("fp32", rows, curve or [28.0, 30.0, 36.0, 40.0, 44.0, 48.0, 52.0, 60.0, 65.0])


def int4(speedup=1.36):
    rows = [
        row("plain", 1.0, 1.0, tpot=11.1, rate=76.3),
        row("suffix@chain:2", speedup, 1.57, 0.13, 14.0, 11.1, 95.7),
    ]
    return Block("int4-g64", rows, [11.1, 12.0, 14.0])


def text(blocks) -> str:
    return "\n".join(reading(blocks))


def test_verified_tokens_per_tree():
    assert verified_tokens("ngram@chain:2") == 3
    assert verified_tokens(f"{HEAD}@dynamic:depth=3,topk=4,tokens=8") == 9
    assert verified_tokens("ngram@auto:3") == 4
    assert verified_tokens("ngram@chain:4+ssd:8") == 5
    assert verified_tokens("hf") is None and verified_tokens("plain") is None


def test_the_losing_sentence_only_when_a_drafter_loses():
    losing = [s for s in reading([fp32()]) if "slower than plain decoding" in s]
    assert len(losing) == 1 and losing[0].startswith("Every drafter")
    assert "0.81x" in losing[0] and "0.43x" in losing[0] and "0.53x" in losing[0]
    assert "Faster than plain decoding" not in text([fp32()])
    some = [s for s in reading([fp32(ngram=1.08)]) if "slower than plain decoding" in s]
    assert some[0].startswith("eagle3@chain:2 and eagle3@dynamic") and "ngram" not in some[0]
    won = text([fp32(ngram=1.08, chain=1.2, tree=1.0)])
    assert "slower than plain decoding" not in won
    assert "Faster than plain decoding on the fp32 target: ngram@chain:2 1.08x" in won


def test_the_numbers_quoted_are_the_rows_numbers():
    out = text([fp32()])
    assert "1.24 for ngram@chain:2, 1.38 for eagle3@chain:2 and 1.67 for eagle3@dynamic" in out
    # eagle3@chain:2: (4.7 + 35.9) / 28.2 = 1.44 plain steps for tau 1.38
    assert "eagle3@chain:2 0.43x: its cycle (draft 4.7 + verify 35.9 ms) costs 1.44 plain steps" in out
    assert "of 28.2 ms and commits tau 1.38 tokens" in out
    # the curve at the rows' tree sizes (3 and 9 tokens) and the ceilings they allow
    assert "1 token 28.0 ms, 3 tokens 36.0 ms (1.29x) and 9 tokens 65.0 ms (2.32x)" in out
    assert "3 / 1.29 = 2.3x on 3 tokens and 9 / 2.32 = 3.9x on 9 tokens" in out
    assert "0.65" not in out  # transformers' generate() is no drafter


@pytest.mark.parametrize(
    ("curve", "says", "not_says"),
    [
        ([28.0, 56.0, 84.0], "100% of a plain step: the forward is compute-bound", "memory-bound:"),
        ([28.0, 28.5, 29.0], "only 2% of a plain step: verification is nearly free", "compute-bound here"),
        ([28.0, 40.0, 50.0], "39% of a plain step, between memory-bound", "compute-bound here"),
    ],
)
def test_the_curve_says_compute_or_memory_bound(curve, says, not_says):
    rows = [row("plain", 1.0, 1.0), row("ngram@chain:2", 0.9, 1.2, 0.1, 30.0)]
    out = text([Block("fp32", rows, curve)])
    assert says in out and not_says not in out


def test_the_verdict_is_read_at_the_dearest_tree_size():
    # this CPU's curve is not monotonic: 3 tokens cost 1.90x one, 9 tokens 2.30x (a real demo run)
    curve = [47.9, 55.41, 90.8, 76.61, 98.2, 81.86, 104.66, 108.16, 110.15]
    out = text([fp32(curve=curve)])
    assert "45% of a plain step, between memory-bound" in out and "nearly free" not in out


def test_a_busy_machine_is_named_only_when_the_rows_disagree_with_the_curve():
    assert not any("timed alone" in s for s in reading([fp32(), int4()]))  # 35.9 vs 36.0 ms, 14.0 vs 14.0
    busy = fp32()
    busy.rows[2]["verify_ms_per_cycle"] = 105.0  # ngram@chain:2: 2.92x the 36.0 ms of 3 tokens alone
    out = reading([busy, int4()])
    warned = [s for s in out if "timed alone" in s]
    assert len(warned) == 1 and "up to 2.9x" in warned[0]
    assert "ngram@chain:2: 105.0 ms per cycle against 36.0 ms for 3 tokens" in warned[0]
    assert out.index(warned[0]) < next(i for i, s in enumerate(out) if "quantized to" in s)  # its block's


def test_the_cheaper_to_verify_block_against_its_own_plain():
    out = reading([fp32(), int4()])
    cheap = [s for s in out if "quantized to int4-g64" in s]
    assert len(cheap) == 1
    assert "76.3 tok/s, 3.25x the fp32 target's" in cheap[0]  # 76.3 / 23.5
    assert "verifying 3 tokens costs 1.26x one token's forward" in cheap[0]  # 14.0 / 11.1
    assert "suffix@chain:2 1.36x" in cheap[0] and "commits tau 1.57 tokens" in cheap[0]
    assert "Here drafting pays" in cheap[0]
    slow = [s for s in reading([fp32(), int4(0.95)]) if "quantized to" in s][0]
    assert "suffix@chain:2 0.95x" in slow and "did not beat" in slow and "pays" not in slow
    assert not any("quantized to" in s for s in reading([fp32()]))


def test_published_evidence_closes_the_reading_and_the_table_labels_each_target():
    assert reading([fp32(), int4()])[-1] == PUBLISHED and "not measured here" in PUBLISHED
    table = side_by_side([fp32(), int4()])
    assert "| int4-g64 | suffix@chain:2 | 95.7 | 1.36 | 1.57 | 0.1 + 14.0 |" in table
    assert "| fp32 | eagle3@chain:2 | 30.0 | 0.43 | 1.38 | 4.7 + 35.9 |" in table
