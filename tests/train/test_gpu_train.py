"""GPU path of training (`pytest -m gpu`): a bf16 (autocast) run on CUDA, its head drafting on CUDA with zero
greedy mismatches, and the engine's EAGLE-3 path there. Skipped without CUDA."""

import json

import pytest
import torch
from train_data import tiny_train_overrides, write_conversations

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.heads.eagle3 import load_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_bf16_training_on_cuda_and_drafting_with_its_head(tiny_dir, tmp_path):
    source = write_conversations(tmp_path / "convs.jsonl")
    out = tmp_path / "run"
    cfg = load_train_config(
        None,
        [
            f"target={tiny_dir}",
            f"output_dir={out}",
            *tiny_train_overrides(source, tmp_path / "data"),
            "train.max_steps=8",
            "train.batch_size=4",
            "eval.every=4",
            "log.every=1",
            "device=cuda",
        ],
    )
    assert cfg.train.mixed_precision == "auto"  # -> bf16 autocast on CUDA
    last = train(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert last["simulated_tau"] >= 1.0
    target = Target.load(str(tiny_dir), device="cuda", dtype="float32")
    head = load_head(out / "final", target).to("cuda")
    prompts = [target.encode("w1 w2 w3"), target.encode("w7 w8"), target.encode("w20 w21 w22 w23")]
    plain = generate_plain(target, prompts, SamplingParams(), 16, batch_size=3)
    for spec in ("chain:3", "dynamic:depth=3,topk=2,tokens=6"):
        drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
        got = generate_speculative(target, drafter, prompts, SamplingParams(), 16, batch_size=3)
        assert [r.token_ids for r in got] == [r.token_ids for r in plain], spec
