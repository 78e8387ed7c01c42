"""The runtime on a target split over gloo ranks, side by side: plain decoding, a drafter at TP = 1 and the
same drafter split over the target's group, chain and tree, at TP = 1, 2 and 4 (BENCHMARKS.md, "The
bundled runtime on a split target").

    python scripts/studies/split_target_bench.py runs/split-bench            # ~15 minutes on 2 cores

It writes a random Llama-shaped target large enough that a forward costs more than a collective (hidden
1024, 8 layers, 16 query / 4 KV heads, SmolLM2's tokenizer and vocabulary, LM head sharpened x 8 as the
tests' tiny targets) and its first two layers as a standalone draft model, so `self:layers=2` (the
drafter split over the group: the target's own layers) and `model:DRAFT` (the same weights whole on rank
0, TP = 1) propose the same tokens and differ only in placement. Then one `draftsmith bench` per TP size
(torchrun for 2 and 4; the methods interleaved, warmed up, median of repeats) and one table: tokens/s,
tau, and the collectives per cycle each row counted (runtime/core/collectives.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=True)  # fmt: skip
DRAFT_LAYERS = 2
SELF, MODEL = f"self:layers={DRAFT_LAYERS}", "model:{draft}"  # the split drafter and the same at TP = 1
METHODS = ["ngram@chain:3", *(f"{d}@{t}" for d in (SELF, MODEL) for t in ("chain:3", "static:binary-3"))]


def make_models(out: Path) -> tuple[Path, Path]:
    """The random target and its first DRAFT_LAYERS layers (same embedding, norm and head) as a model."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from draftsmith.runtime.core.targets import resolve_target

    target_dir, draft_dir = out / "target", out / "draft"
    if (target_dir / "config.json").is_file() and (draft_dir / "config.json").is_file():
        return target_dir, draft_dir
    tokenizer = AutoTokenizer.from_pretrained(resolve_target("smollm2-135m").path)
    config = LlamaConfig(vocab_size=len(tokenizer), **SHAPE, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(8.0)  # tied: sharpens the head (and scales the input)
    target.save_pretrained(target_dir, max_shard_size="200MB")
    tokenizer.save_pretrained(target_dir)
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": DRAFT_LAYERS})
    draft = LlamaForCausalLM(draft_config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # layers >= DRAFT_LAYERS have no place here
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)
    return target_dir, draft_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(target: Path, draft: Path, tp: int, out: Path) -> list[dict]:
    args = [
        "bench",
        "--target",
        str(target),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--prompts",
        "humaneval",
    ]
    args += ["--num-prompts", "6", "--max-new-tokens", "48", "--batch-sizes", "1", "--repeats", "3"]
    args += [
        "--baselines",
        "plain",
        "--no-plots",
        "--no-roofline",
        "--out",
        str(out),
        "--cpu-linears",
        "torch",
    ]
    for (
        spec
    ) in METHODS:  # F.linear at every TP size (a split target keeps it; the W @ x^T plan is whole-only)
        args += ["--draft", spec.format(draft=draft)]
    launcher = [sys.executable, "-m", "draftsmith.runtime.cli"]
    if tp > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={tp}"]
        launcher = [*torchrun, f"--master-port={free_port()}", "-m", "draftsmith.runtime.cli"]
        args += ["--target-placement", "tp", "--tp-size", str(tp)]
    env = os.environ | {"OMP_NUM_THREADS": str(max(1, 2 // tp))}
    subprocess.run([*launcher, *args], check=True, env=env, cwd=ROOT)
    found = json.loads((out / "results.json").read_text())
    return found["rows"] if isinstance(found, dict) else found


def collective_words(row: dict) -> str:
    per = (row.get("collectives") or {}).get("per_cycle", {})
    parts = []
    for phase in ("draft", "verify", "step"):
        if phase in per:
            kinds = per[phase]
            said = " + ".join(f"{v['count']:g} {k.replace('_', '-')}" for k, v in kinds.items()) or "0"
            parts.append(f"{phase}: {said}")
    return "; ".join(parts) or "-"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    target, draft = make_models(out)
    print("| TP | method | tok/s | tau | collectives per cycle |\n|---:|---|---:|---:|---|")
    for tp in (1, 2, 4):
        for row in bench(target, draft, tp, out / f"tp{tp}"):
            method = row["method"].replace(str(draft), "DRAFT")
            rate, tau = row["tokens_per_s"], row["mean_accepted"]
            print(f"| {tp} | {method} | {rate:.1f} | {tau:.2f} | {collective_words(row)} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/split-bench"))
