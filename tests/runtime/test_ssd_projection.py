"""scripts/studies/ssd_projection.py, the SSD projection (a study, outside the package): its cost model
(hand-computed arithmetic) and the replay it feeds (controls with known answers). Float tolerances: the
costs are a few dozen float64 operations, so rel 1e-12.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_ssd_projection.py -q
"""

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

# the study imports its sibling ssd_costs.py by name, as it does when run as a script
sys.path.append(str(Path(__file__).resolve().parents[2] / "scripts" / "studies"))
from ssd_costs import (
    CALIBRATION_CONTEXT,
    EAGLE3_70B,
    EAGLE3_70B_FC,
    H100_SXM,
    LLAMA_31_8B,
    LLAMA_32_1B,
    LLAMA_33_70B,
    Model,
    allreduce_s,
    calibrate,
    comm_s,
    memory_s,
    step_s,
)
from ssd_projection import (
    EAGLE3,
    LM_1B,
    Drafter,
    draft_chain_s,
    main,
    project,
    sample_rank,
    synthetic_cycles,
)

from draftsmith.runtime.bench.ssd_replay import CostModel, simulate

REL = 1e-12
SUSTAINED = 3.35e12 * 0.80  # H100 SXM peak HBM x the stated efficiency


def test_parameter_counts_match_the_published_ones():
    assert LLAMA_33_70B.params == 70_553_706_496
    assert LLAMA_32_1B.params == 1_235_814_400
    assert LLAMA_31_8B.params == 8_030_261_248
    # EAGLE-3 head, by hand: q 16384x8192, k and v 16384x1024, o 8192x8192, MLP 3x8192x28672,
    # fc 24576x8192, LM head 8192x32000, 4 RMSNorm weights of 8192
    parts = [134_217_728, 2 * 16_777_216, 67_108_864, 704_643_072, 201_326_592, 262_144_000, 4 * 8192]
    assert EAGLE3_70B.params == sum(parts) == 1_403_027_456
    assert EAGLE3_70B_FC == 201_326_592
    assert EAGLE3_70B.read_bytes == 2 * (sum(parts) - 201_326_592)  # the fc is read once per chain


def test_bytes_read_leave_out_an_untied_embedding_only():
    assert LLAMA_33_70B.read_bytes == 2 * (70_553_706_496 - 128256 * 8192) == 139_006_066_688
    assert LLAMA_32_1B.read_bytes == 2 * 1_235_814_400  # tied: the table is the LM head
    assert LLAMA_33_70B.kv_bytes_token == 2 * 80 * 8 * 128 * 2 == 327_680


def test_memory_and_allreduce_arithmetic():
    want = (139_006_066_688 / 4 + 1024 * 327_680 / 4) / SUSTAINED
    assert memory_s(LLAMA_33_70B, H100_SXM, 4, 1024) == pytest.approx(want, rel=REL)
    assert want == pytest.approx(34_835_402_752 / 2.68e12, rel=REL)  # ~13.0 ms
    # one token's activation: 8192 x 2 bytes; ring term 2 (4 - 1) / 4 of it over 450 GB/s, plus 8 us
    one = 8e-6 + 1.5 * 16384 / 450e9
    assert allreduce_s(H100_SXM, 4, 16384) == pytest.approx(one, rel=REL)
    assert comm_s(LLAMA_33_70B, H100_SXM, 4, 1) == pytest.approx(160 * one, rel=REL)  # 2 per layer x 80
    assert allreduce_s(H100_SXM, 1, 16384) == 0.0


def test_calibration_by_hand_on_round_numbers():
    """calibrate and step_s on a made-up GPU and models whose answers are worked out by hand, so the
    projection is checked on a step it was not fitted to (the 8B measurement alone would be reproduced by
    construction, whatever step_s got wrong)."""
    assert CALIBRATION_CONTEXT == 512  # the context of the fitted step (an assumption of ssd_costs)
    gpu = replace(H100_SXM, hbm_bytes_s=1e12, hbm_efficiency=0.5, target_overhead_s=0.0)  # 5e11 B/s
    fitted = Model("fit", 0, read_bytes=10**9, matmul_params=10**8, layers=2, hidden=64, kv_bytes_token=1000)
    # 100 tok/s = 10 ms a step; memory (1e9 + 512 x 1000) / 5e11 = 2.001024 ms; compute ~0.0004 ms below it
    gpu = calibrate(gpu, 100.0, fitted)
    assert gpu.target_overhead_s == pytest.approx(10e-3 - 2.001024e-3, rel=REL)
    # another model, another context, two GPUs: (3e9 / 2 + 1024 x 2000 / 2) / 5e11 = 3.002048 ms, plus the
    # 7.998976 ms overhead, plus 2 x 4 all-reduces of 1 x 128 x 2 bytes: 8 x (8 us + 256 / 450e9) each
    other = Model(
        "other", 0, read_bytes=3 * 10**9, matmul_params=10**8, layers=4, hidden=128, kv_bytes_token=2000
    )
    want = 3.002048e-3 + 7.998976e-3 + 8 * (8e-6 + 256 / 450e9)
    assert step_s(other, gpu, 2, 1, 1024) == pytest.approx(want, rel=REL)
    with pytest.raises(ValueError, match="beats the roofline"):
        calibrate(gpu, 1000.0, fitted)  # 1 ms a step: faster than reading the weights


def test_the_calibrated_h100_overhead_is_plausible():
    # SGLang, Llama-3.1-8B bf16, one H100, batch 1: 158.34 tok/s (EAGLE-3 paper Table 4), less the memory
    # time by hand: 15.0 GB of weights + 512 tokens of KV over 2.68 TB/s
    body = (15_009_849_344 + 512 * 131_072) / SUSTAINED
    assert H100_SXM.target_overhead_s == pytest.approx(1 / 158.34 - body, rel=1e-9)
    assert 0.5e-3 < H100_SXM.target_overhead_s < 1e-3  # an engine step's fixed cost, not a fudge


def test_verification_is_flat_in_k_until_the_ridge():
    one = step_s(LLAMA_33_70B, H100_SXM, 4, 1)
    assert step_s(LLAMA_33_70B, H100_SXM, 4, 8) / one < 1.01  # 8 tokens cost what 1 does
    # compute passes memory near k = 369 * 0.6 / ~0.99 (FLOP per byte at the ridge x MFU): far past K
    assert step_s(LLAMA_33_70B, H100_SXM, 4, 1024) > 2 * one
    assert step_s(LLAMA_33_70B, H100_SXM, 8, 1) < step_s(LLAMA_33_70B, H100_SXM, 4, 1)


def test_draft_chain_arithmetic():
    gpu = H100_SXM
    fwd = EAGLE3_70B.read_bytes / SUSTAINED + 1024 * EAGLE3_70B.kv_bytes_token / SUSTAINED
    fixed = gpu.draft_base_s + gpu.draft_layer_s  # one layer
    assert step_s(EAGLE3_70B, gpu, 1, 1, 1024, draft=True) == pytest.approx(fwd + fixed, rel=REL)
    fc = EAGLE3_70B_FC * 2 / SUSTAINED
    assert draft_chain_s(EAGLE3, gpu, 3) == pytest.approx(3 * (fwd + fixed) + fc, rel=1e-9)
    # the 1B: 16 layers of fixed cost, 2.47 GB a forward
    lm = (2 * 1_235_814_400 + 1024 * 2 * 16 * 8 * 64 * 2) / SUSTAINED + 50e-6 + 16 * 10e-6
    assert step_s(LLAMA_32_1B, gpu, 1, 1, 1024, draft=True) == pytest.approx(lm, rel=REL)
    assert draft_chain_s(Drafter("free", None, 0.5), gpu, 7) == 0.0


def test_rank_law_inverse_by_hand():
    # bonus, alpha 0.77: P(rank >= f) = 0.23 / f -> u = 0.1 lies below 0.23 and 0.115, above 0.0767: rank 2
    assert sample_rank(0.5, 0.77, bonus=True) == 0
    assert sample_rank(0.1, 0.77, bonus=True) == 2
    # after a rejection: P(rank >= f) = 1 / (f + 1) -> u = 0.3 below 1/2 and 1/3, above 1/4: rank 2
    assert sample_rank(0.3, 0.77, bonus=False) == 2
    assert sample_rank(0.99, 0.77, bonus=False) == 0
    assert sample_rank(1e-6, 0.77, bonus=False) == -1  # past the 32 ranked candidates


def test_synthetic_cycles_follow_the_profile():
    n, alpha, depth = 20000, 0.77, 7
    cycles = synthetic_cycles(alpha, depth, n, seed=1)
    full = [c for c in cycles if c.accepted == depth]
    p = alpha**depth  # 0.160
    assert abs(len(full) / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    tau = (1 - alpha ** (depth + 1)) / (1 - alpha)  # 3.81 tokens per cycle
    mean = sum(c.accepted + 1 for c in cycles) / n
    assert abs(mean - tau) < 0.05  # sd of a + 1 is ~2.6: 4 sigma of the mean is 0.07; seed fixed
    top = sum(c.rank == 0 for c in full) / len(full)
    assert abs(top - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / len(full))


def test_a_free_drafter_gives_ssd_equal_to_sync():
    # zero draft cost and zero latency: nothing to hide, so SSD == sync to rounding
    free = Drafter("free", None, 0.77)
    rows = project([4], [8, 16], n=500, gpu=replace(H100_SXM, p2p_latency_s=0.0), drafters=(free,))[4]
    sync, ssd = rows[1], rows[3:]
    assert sync.method.startswith("sync") and all(r.method.startswith("SSD") for r in ssd)
    for r in ssd:
        assert r.tokens_s == pytest.approx(sync.tokens_s, rel=1e-12)
    # with a round trip to pay and no draft to hide, SSD is strictly slower
    rows = project([4], [8], n=500, drafters=(free,))[4]
    assert rows[3].tokens_s < rows[1].tokens_s


def test_speculation_longer_than_the_window_caps_ssd():
    cycles = synthetic_cycles(0.7, 7, 400, seed=2)
    verify = step_s(LLAMA_33_70B, H100_SXM, 8, 8)
    draft = draft_chain_s(LM_1B, H100_SXM, 7)
    spec = 3 * verify  # a drafter whose pre-speculation takes 3 verifications
    cost = CostModel(draft, verify, 0.0, spec, 0.0)
    pred = simulate(cycles, 16, cost)
    # every overlapped cycle lasts the speculation at least: SSD is slower than sync here
    assert pred.ssd_s >= (len(cycles) - 1) * spec
    assert pred.speedup < 1
    # a drafter that stops at the verdict: 4 branches of verify / 4 fit, so fewer outcomes hit
    partial = simulate(cycles, 16, CostModel(draft, verify, verify / 4, 0.0, 0.0), interrupt=True)
    assert 0.0 < partial.hit_rate < pred.hit_rate
    late = CostModel(draft, verify, 1e-3, 2 * verify, 0.0)  # the fixed part alone outlasts the window
    assert simulate(cycles, 16, late, interrupt=True).hit_rate == 0.0


def test_ssd_pays_off_for_the_lm_drafter_not_the_head():
    tables = project([4, 8], [8, 16, 32], n=2000)
    for rows in tables.values():
        by = {r.method: r for r in rows}
        assert by["plain (no speculation)"].vs_plain == 1.0
        for b in (8, 16, 32):
            head, lm = by[f"SSD EAGLE-3 head fan-out {b}"], by[f"SSD Llama-3.2-1B fan-out {b}"]
            assert lm.vs_sync > head.vs_sync  # the 1B's chain is the larger share of a cycle
            assert lm.vs_sync > 1.0
        hits = [by[f"SSD Llama-3.2-1B fan-out {b}"].hit_rate for b in (8, 16, 32)]
        assert hits == sorted(hits) and hits[0] < hits[-1]  # a larger budget catches more outcomes


def test_cli_prints_a_projection_and_refuses_bad_input(capsys):
    assert main(["--tp", "4", "--cycles", "200", "--fanout", "8"]) == 0
    out = capsys.readouterr().out
    assert "**Projection** (not a measurement)" in out and "| plain (no speculation) |" in out
    assert out.count("| SSD ") == 2  # one budget, two drafters
    assert main(["--fanout", "4"]) == 2  # below K + 1 = 8
    assert "--fanout" in capsys.readouterr().err
    assert main(["--tp", "1"]) == 2  # 139 GB of weights on one 80 GB GPU
    assert main(["--depth", "0"]) == 2
