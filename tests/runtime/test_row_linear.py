"""The small-row linears (runtime/core/row_linear.py): `W @ x^T` stays within fp32's summation bound of a
float64 product for every row count, rows outside the plan are F.linear bit for bit, the state_dict and
parameters are untouched, the plan picks exactly the faster row counts, the cache is used, checked and
rewritten atomically, transformers' baseline runs F.linear, and plain greedy decoding with the plan gives
F.linear's tokens on the tiny target (or a near-tie, the bench's rule for any kernel change)."""

import json
import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.runtime.core import row_linear
from draftsmith.runtime.core.row_linear import (
    RowsLinear,
    check_mode,
    measure_rows_plan,
    torch_linears,
    tune_rows_plan,
    use_rows_linear,
)
from draftsmith.runtime.errors import BadInputError


def fp32_bound(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|fl(sum) - sum| <= gamma_n * sum |w_i x_i| (Higham, Accuracy and Stability, eq. 3.5), n = in + 1
    (the bias), gamma_n = n u / (1 - n u), u = 2^-24; each product is rounded once more (+1)."""
    n = w.shape[1] + 2
    u = 2.0**-24
    return (n * u / (1 - n * u)) * (x.abs().double() @ w.abs().double().t() + 1.0)


def test_every_row_count_is_within_the_fp32_bound():
    torch.manual_seed(0)
    linear = nn.Linear(80, 96)
    use_rows_linear(linear, set(range(1, 17)))
    for rows in range(1, 17):
        x = torch.randn(rows, 80)
        exact = x.double() @ linear.weight.double().t() + linear.bias.double()
        got = linear(x)
        assert got.shape == (rows, 96) and got.is_contiguous()
        assert ((got.double() - exact).abs() <= fp32_bound(linear.weight, x)).all(), rows
    x3 = torch.randn(2, 3, 80)  # [batch, tokens, in]: 6 rows
    assert torch.equal(linear(x3), linear(x3.reshape(6, 80)).reshape(2, 3, 96))


def test_rows_outside_the_plan_are_f_linear_bit_for_bit():
    torch.manual_seed(1)
    linear = nn.Linear(64, 32, bias=False)
    keys = {k: v.clone() for k, v in linear.state_dict().items()}
    assert use_rows_linear(linear, {2}) == 1 and type(linear) is RowsLinear
    assert linear.state_dict().keys() == keys.keys()
    assert all(torch.equal(linear.state_dict()[k], v) for k, v in keys.items())
    for rows in (1, 3, 17):
        x = torch.randn(rows, 64)
        assert torch.equal(linear(x), F.linear(x, linear.weight))
    double = nn.Linear(64, 32, bias=False).double()
    use_rows_linear(double, {2})
    x = torch.randn(2, 64, dtype=torch.float64)
    assert torch.equal(double(x), F.linear(x, double.weight))  # fp32 only


def test_torch_linears_restores_each_plan():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    use_rows_linear(model, {1, 2})
    with torch_linears(model):
        assert all(m.rows_plan == frozenset() for m in model)
    assert all(m.rows_plan == frozenset({1, 2}) for m in model)


def test_the_plan_keeps_the_faster_row_counts(monkeypatch):
    costs = {frozenset(): [1.0, 2.0, 3.0, 4.0, 5.0], "rows": [0.5, 2.5, 2.0, 4.0, 4.7]}
    calls = []

    def fake_costs(target, plan, max_rows, repeats):
        calls.append(plan)
        return costs[frozenset()] if not plan else costs["rows"]

    monkeypatch.setattr(row_linear, "forward_costs", fake_costs)
    record = measure_rows_plan(object(), max_rows=5, rounds=2)
    assert record["plan"] == [1, 3]  # 4: a tie is no win; 5: 6% faster is inside the timing noise (WIN)
    assert record["f_linear_ms"] == [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
    assert calls == [frozenset(), frozenset({1, 2, 3, 4, 5})] * 2  # alternated


def test_the_plan_is_keyed_by_the_cpu_model(tiny_dir, monkeypatch):
    """VMs of different CPUs share the host name `vm` and a home folder: an AMD plan must not serve an Intel
    machine (W @ x^T wins 3x on the AMD EPYC and loses 2x at 3 rows on the Intel Xeon here)."""
    target = fresh_tiny(tiny_dir)
    monkeypatch.setattr(row_linear, "cpu_model", lambda: "AMD EPYC 7B13")
    amd = row_linear.plan_key(target)
    monkeypatch.setattr(row_linear, "cpu_model", lambda: "Intel(R) Xeon(R) Processor")
    assert row_linear.plan_key(target) != amd
    monkeypatch.undo()
    if Path("/proc/cpuinfo").is_file():  # the model name, not the architecture platform.processor() gives
        assert row_linear.cpu_model() not in ("", platform.machine())


def fresh_tiny(tiny_dir):
    from draftsmith.runtime.core.target import Target

    return Target.load(str(tiny_dir), device="cpu", dtype="float32")


def test_tuning_is_cached_and_a_damaged_cache_is_measured_again(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(row_linear, "CACHE_DIR", tmp_path)
    target = fresh_tiny(tiny_dir)
    measured = []
    monkeypatch.setattr(
        row_linear,
        "measure_rows_plan",
        lambda t, m: measured.append(m) or {"plan": [1, 2], "f_linear_ms": [1.0], "w_xt_ms": [0.5]},
    )
    assert tune_rows_plan(target) == frozenset({1, 2}) and len(measured) == 1
    (entry,) = tmp_path.glob("rows-plan-*.json")
    assert json.loads(entry.read_text())["max_rows"] == row_linear.MAX_ROWS
    assert tune_rows_plan(target) == frozenset({1, 2}) and len(measured) == 1  # read from the cache
    assert all(m.rows_plan == frozenset({1, 2}) for m in target.model.modules() if isinstance(m, nn.Linear))
    entry.write_text("{not json")
    assert tune_rows_plan(target) == frozenset({1, 2}) and len(measured) == 2
    assert not list(tmp_path.glob("*.tmp*"))  # written through a temporary file, renamed


def test_only_fp32_cpu_targets_are_tuned(tiny_dir, monkeypatch):
    from draftsmith.runtime.core.target import Target

    monkeypatch.setattr(row_linear, "measure_rows_plan", lambda *a: pytest.fail("measured a bf16 target"))
    target = Target.load(str(tiny_dir), device="cpu", dtype="bfloat16")
    assert tune_rows_plan(target, cache=False) == frozenset()


def test_bad_mode_is_refused():
    assert check_mode("--cpu-linears", "auto") == "auto"
    with pytest.raises(BadInputError, match="auto, torch") as err:
        check_mode("cpu_linears", "fast")
    assert err.value.exit_code == 2 and err.value.field == "cpu_linears"


def test_greedy_tokens_match_f_linear_and_hf_runs_f_linear(tiny_dir):
    from draftsmith.runtime.bench.side_by_side import hf_generate_batch
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.verify.near_tie import first_mismatch
    from draftsmith.runtime.verify.sampling import SamplingParams

    target = fresh_tiny(tiny_dir)
    prompts = [[1, 5, 9, 3], [7, 7, 2], [4, 8, 15, 16, 23, 42]]
    reference = [r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 16)]
    use_rows_linear(target.model, set(range(1, 17)))
    for batch in (1, 3):  # rows = batch at each step
        got = [r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 16, 0, batch)]
        for prompt, mine, ref in zip(prompts, got, reference):
            assert mine == ref or first_mismatch(target, prompt, mine, ref).near_tie
    seen = []
    inner = target.model.generate
    target.model.generate = lambda *a, **k: seen.append(target.model.lm_head.rows_plan) or inner(*a, **k)
    try:
        hf_generate_batch(target, prompts[:1], 4)
    finally:
        del target.model.generate
    assert seen == [frozenset()] and target.model.lm_head.rows_plan == frozenset(range(1, 17))


def test_torch_linears_rows_in_the_bench(tiny_dir):
    """`METHOD+torch-linears` runs the same method with the plan off for its calls only; baselines other
    than plain are refused (exit 2)."""
    from draftsmith.runtime.bench.methods import build_method
    from draftsmith.runtime.verify.sampling import SamplingParams

    target = fresh_tiny(tiny_dir)
    use_rows_linear(target.model, set(range(1, 17)))
    method = build_method("ngram@chain:2+torch-linears", target, [1])
    seen = []
    inner_run = method.inner.run
    method.inner.run = lambda *a: seen.append(target.model.lm_head.rows_plan) or inner_run(*a)
    out = method.run([[1, 2, 3, 1, 2]], SamplingParams(), 6, 0)
    assert seen == [frozenset()] and target.model.lm_head.rows_plan == frozenset(range(1, 17))
    assert len(out.token_ids[0]) == 6 and out.spec is not None and method.drafter is method.inner.drafter
    assert method.facts == {"cpu_linears": "torch"}
    assert build_method("plain+torch-linears", target, [1]).inner.drafter is None
    for bad in ("hf+torch-linears", "vllm+torch-linears"):
        with pytest.raises(BadInputError, match="torch-linears") as err:
            build_method(bad, target, [1])
        assert err.value.exit_code == 2


def test_a_drafters_own_modules_take_the_plan_the_targets_do_not_twice():
    from types import SimpleNamespace

    from draftsmith.runtime.core.row_linear import drafter_roots

    target = SimpleNamespace(model=nn.Linear(4, 4))
    head = nn.Sequential(nn.Linear(4, 8))
    drafter = SimpleNamespace(head=head, target=target, model=target.model, depth=2)
    assert drafter_roots(drafter, target) == [head] and drafter_roots(None, target) == []
    use_rows_linear(head, {1})
    with torch_linears(target.model, *drafter_roots(drafter, target)):
        assert head[0].rows_plan == frozenset()
    assert head[0].rows_plan == frozenset({1})


def test_a_target_with_every_linear_quantized_is_not_timed(tiny_dir, monkeypatch):
    from draftsmith.runtime.core.quantize import parse_quantize, quantize_target

    monkeypatch.setattr(row_linear, "measure_rows_plan", lambda *a: pytest.fail("timed quantized linears"))
    target = fresh_tiny(tiny_dir)
    quantize_target(target, parse_quantize("int8", None))
    assert tune_rows_plan(target, cache=False) == frozenset()
