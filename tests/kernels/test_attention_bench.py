"""scripts/studies/attention_bench.py's plumbing on CPU (it runs unattended on a lent GPU): every method is
timed on every shape and agrees with the fp32 reference; the table prints."""

import torch
from repo_files import load_repo_file


def load_script():
    return load_repo_file("scripts/studies/attention_bench.py")


def test_attention_bench_measures_every_method_on_every_shape(capsys):
    bench = load_script()
    rows = bench.measure(torch.device("cpu"), torch.float32, [1, 2], [1, 16], 64, rounds=1, calls=1)
    assert [(r["batch"], r["nodes"]) for r in rows] == [(1, 1), (1, 16), (2, 1), (2, 16)]
    for row in rows:
        methods = {k: v for k, v in row.items() if isinstance(v, dict)}
        assert set(methods) == {"sdpa", "flex", "flex, block mask prebuilt"}  # no Triton kernel off CUDA
        assert all(m["ms"] > 0 and m["max_abs_error"] < 1e-4 for m in methods.values())
    bench.print_table({"device": "cpu", "dtype": "float32", "flex": "eager", "rows": rows})
    assert "| 2 | 16 |" in capsys.readouterr().out
