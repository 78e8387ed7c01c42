"""`--quantize` / `--quantize-draft` through `generate` and `bench` on the tiny target folder: the quantized
target's plain and speculative tokens agree, a head trained on the unquantized target binds to it, and bad
input exits with code 2 naming the field (runtime/core/quantize.py).

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_quantize_cli.py -q
"""

import json

import pytest
import torch
from tiny_models import make_tiny_dir

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, save_head


@pytest.fixture(scope="module")
def mtp_head(tiny_target, tmp_path_factory):
    """Two MTP modules made for the unquantized tiny target (its weights hash recorded)."""
    folder = tmp_path_factory.mktemp("mtp2") / "head"
    torch.manual_seed(1)
    save_head(MtpHead(MtpConfig.for_target(tiny_target, num_modules=2)), folder)
    return folder


def generate(target_dir, capsys, *extra):
    argv = ["generate", "--target", str(target_dir), "--prompt", "w1 w2 w3 w1 w2", "--max-new-tokens", "12"]
    code = main([*argv, "--json", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_generate_with_a_quantized_target_and_draft(tiny_dir, mtp_head, capsys, mode):
    code, plain, err = generate(tiny_dir, capsys, "--quantize", mode)
    assert code == 0, err
    for draft in ("ngram", "self:layers=2", f"mtp:{mtp_head}"):
        extra = ["--quantize-draft", "int4"] if draft.startswith("mtp") else []
        code, out, err = generate(tiny_dir, capsys, "--quantize", mode, "--draft", draft, *extra)
        assert code == 0, err
        row = json.loads(out)
        assert row["token_ids"] == json.loads(plain)["token_ids"], draft
        assert row["draft_forwards"] > 0 or draft == "ngram"
    code, fp32, err = generate(tiny_dir, capsys)
    assert code == 0, err
    if mode == "int4":  # a control: the quantized target is another function (int8 may keep these 12)
        assert json.loads(fp32)["token_ids"] != json.loads(plain)["token_ids"]
    code, out, err = generate(tiny_dir, capsys, "--quantize", mode, "--dtype", "bfloat16", "--draft", "ngram")
    assert code == 0, err  # a bf16 target's activations are bf16 already


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--quantize", "int4", "--group-size", "48"],
            "--group-size: got 48, expected one of (32, 64, 128, 256)",
        ),
        (["--quantize", "int4", "--group-size", "256"], "in_features=64"),
        (["--quantize", "int8", "--group-size", "64"], "--group-size: got 64"),
        (["--quantize", "fp8"], "compute capability >= 8.9"),
        (["--quantize-draft", "int8", "--draft", "ngram"], "ngram has none"),
        (
            ["--quantize-draft", "int8", "--draft", "self:layers=2"],
            "self:layers=N runs the target's own layers",
        ),
        (["--quantize-draft", "int8"], "--quantize-draft"),
    ],
)
def test_bad_quantization_exits_2(tiny_dir, capsys, extra, message):
    code, _, err = generate(tiny_dir, capsys, *extra)
    assert code == 2 and message in err, err


def test_a_head_of_another_target_is_refused_quantized_or_not(tmp_path, mtp_head, capsys):
    other = make_tiny_dir(tmp_path / "other")  # the same shapes, other weights
    with torch.no_grad():
        target = Target.load(str(other), device="cpu")
        target.model.model.norm.weight.mul_(1.5)
        target.model.save_pretrained(other)
    for extra in ([], ["--quantize", "int8", "--quantize-draft", "int8"]):
        code, _, err = generate(other, capsys, "--draft", f"mtp:{mtp_head}", *extra)
        assert code == 2 and "target_weights_hash" in err, err


def test_bench_with_a_quantized_target(tiny_dir, mtp_head, tmp_path, monkeypatch):
    from draftsmith.runtime.bench import roofline as roof

    monkeypatch.setattr(roof, "CACHE_DIR", tmp_path / "machine")
    monkeypatch.setattr(roof, "copy_bandwidth", lambda device: 5e9)
    monkeypatch.setattr(roof, "matmul_rate", lambda device, dtype: 1e11)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i} w{i + 1}"}) for i in range(3)))
    out = tmp_path / "bench"
    argv = [
        "bench",
        "--target",
        str(tiny_dir),
        "--draft",
        "ngram@chain:2",
        "--draft",
        f"mtp:{mtp_head}@chain:2",
    ]
    argv += ["--prompts", f"jsonl:{prompts}", "--num-prompts", "3", "--max-new-tokens", "6", "--no-plots"]
    argv += ["--batch-sizes", "1", "--baselines", "plain,hf", "--out", str(out), "--quantize", "int4"]
    assert main([*argv, "--quantize-draft", "int8"]) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in rows] == ["plain", "hf", "ngram@chain:2", f"mtp:{mtp_head}@chain:2"]
    assert all(r["greedy_identical"] for r in rows)  # hf's generate() runs the same quantized modules
    meta = json.loads((out / "meta.json").read_text())
    assert meta["quantization"] == {"target": "int4-g64", "drafts": {f"mtp:{mtp_head}@chain:2": "int8"}}
    line = meta["roofline"]["lines"][0]
    fp32_bytes = sum(p.numel() * 4 for p in Target.load(str(tiny_dir), device="cpu").model.parameters())
    assert line["weight_bytes"] < fp32_bytes / 3  # the step reads int4 codes, not fp32 weights
    assert main([*argv[:-2], "--quantize", "int8", "--baselines", "plain,vllm"]) == 2  # vLLM: unquantized
