"""`draftsmith data prepare | regenerate | capture | vocab`: flags here, work in draftsmith.data_recipes.

Each step's module is imported only when the step runs (it needs `datasets`, which the rest of the
runtime never imports); it exposes `run_from_args(args)`.
"""

from __future__ import annotations

import argparse

from draftsmith.runtime.cli import verb_texts
from draftsmith.runtime.cli.args import (
    add_mode_options,
    add_placement_args,
    add_target_args,
    add_thinking_arg,
    add_verb,
    declare_needs,
    declare_outputs,
    finite_float_arg,
    int_arg,
)
from draftsmith.runtime.errors import flag_needs


def add_data(sub) -> None:
    p = add_verb(sub, "data", *verb_texts.DATA)
    steps = p.add_subparsers(dest="step", required=True, metavar="STEP")
    add_prepare(steps)
    add_regenerate(steps)
    add_capture(steps)
    add_vocab(steps)


def add_step(steps, name: str, help: str, target: bool = True) -> argparse.ArgumentParser:
    """One `data` step: its parser, the target's flags first (unless it loads no target), and --out
    declared as the folder it writes (checked before the step starts)."""
    p = add_verb(steps, name, help, run=_run_data(name))
    if target:
        add_target_args(p)
    declare_outputs(p, dirs=("--out",))
    return p


def add_prepare(steps) -> None:
    """`data prepare`: conversations -> token ids and loss masks."""
    prep = add_step(steps, "prepare", "conversations -> chat-templated token ids + assistant-only loss masks")
    prep.add_argument(
        "--source",
        required=True,
        help="sharegpt (bundled ShareGPT V3), a local .json/.jsonl/.parquet file of conversations (ShareGPT "
        "from/value or OpenAI role/content), prompts:FILE (one user turn per line), or datasets NAME[:SPLIT]",
    )
    prep.add_argument("--out", required=True, help="output folder (a datasets DatasetDict + record)")
    prep.add_argument(
        "--max-samples", type=int_arg("--max-samples"), default=None, help="stop after N kept rows"
    )
    prep.add_argument(
        "--max-length",
        type=int_arg("--max-length"),
        default=2048,
        help="tokens per row; longer rows are clipped",
    )
    prep.add_argument("--validation-fraction", type=finite_float_arg("--validation-fraction"), default=0.05)
    prep.add_argument("--seed", type=int_arg("--seed"), default=0, help="seed of the train/validation split")
    prep.add_argument(
        "--fail-on-clip", action="store_true", help="error instead of clipping an over-long row"
    )
    add_thinking_arg(prep, "render the conversations (regenerate and capture follow the mode recorded here)")


def add_regenerate(steps) -> None:
    """`data regenerate`: the target's own answers in place of the assistant turns."""
    regen = add_step(
        steps, "regenerate", "replace assistant turns with the target's own answers (self-distillation)"
    )
    regen.add_argument("--data", required=True, help="a prepared folder")
    regen.add_argument("--out", required=True, help="output folder (same format as prepare's)")
    regen.add_argument("--temperature", type=finite_float_arg("--temperature"), default=0.0)
    regen.add_argument("--top-p", type=finite_float_arg("--top-p"), default=1.0)
    regen.add_argument("--top-k", type=int_arg("--top-k"), default=0)
    regen.add_argument(
        "--max-new-tokens", type=int_arg("--max-new-tokens"), default=512, help="per assistant turn"
    )
    regen.add_argument("--seed", type=int_arg("--seed"), default=0)
    regen.add_argument("--batch-size", type=int_arg("--batch-size"), default=8)
    add_shard_args(regen, "conversations")
    add_placement_args(regen, DATA_REPLICATE)
    add_engine_args(regen)


def add_capture(steps) -> None:
    """`data capture`: the target's hidden states per token."""
    about = (
        "store the target's aux and final (pre-norm) hidden states per token: shard-NNNNN.safetensors with "
        "input_ids, loss_mask, aux_hidden [N, A*H], last_hidden [N, H], offsets"
    )
    cap = add_step(steps, "capture", about)
    cap.add_argument("--data", required=True, help="a prepared or regenerated folder")
    cap.add_argument("--out", required=True, help="output folder of safetensors shards + record")
    cap.add_argument(
        "--aux-layers",
        default="auto",
        help="comma-separated ids of decoder-layer outputs, 0-based (id i = transformers hidden_states[i+1], "
        "SGLang/SpecForge convention; vLLM/speculators call it i+1); auto = 1, L//2-1, L-4",
    )
    add_storage_args(cap)
    cap.add_argument("--split", default="train", help="train, validation or all")
    cap.add_argument("--shard-tokens", type=int_arg("--shard-tokens"), default=65536, help="tokens per shard")
    add_shard_args(cap, "rows (about equal tokens)")
    add_placement_args(cap, DATA_REPLICATE)
    add_engine_args(cap)


FP8_OPTIONS = {  # what fp8 storage keeps wider
    "--fp8-last-hidden": dict(
        action="store_true",
        help="with --storage-dtype fp8: store the last hidden state (the target's logits) in fp8 too",
    ),
    "--fp8-bf16-layers": dict(
        default=None,
        metavar="IDS",
        help="with --storage-dtype fp8: aux layer ids (of --aux-layers) kept in bfloat16, e.g. 1: the "
        "shallowest aux layer loses the most to fp8 (+0.6x its bytes, BENCHMARKS.md)",
    ),
}


def add_storage_args(p: argparse.ArgumentParser) -> None:
    """How capture stores the hidden states: the dtype, and what fp8 storage keeps wider."""
    p.add_argument(
        "--storage-dtype",
        default="bfloat16",
        help="bfloat16, float16, float32, or fp8: the aux states as float8_e4m3fn with per-token scales "
        "(about 0.6x the bytes of bfloat16; the last hidden state stays bfloat16)",
    )
    add_mode_options(p, "--storage-dtype fp8", lambda a: a.storage_dtype == "fp8", FP8_OPTIONS)


def add_vocab(steps) -> None:
    """`data vocab`: the draft-vocabulary map."""
    voc = add_step(
        steps, "vocab", "draft-vocabulary map (d2t offsets, t2d mask) from supervised tokens", target=False
    )
    voc.add_argument("--data", required=True, help="a prepared or regenerated folder")
    voc.add_argument("--draft-vocab-size", type=int_arg("--draft-vocab-size"), required=True)
    voc.add_argument("--out", required=True, help="output folder (draft_vocab.safetensors + record)")


def add_shard_args(p: argparse.ArgumentParser, unit: str) -> None:
    p.add_argument(
        "--num-shards",
        type=int_arg("--num-shards"),
        default=1,
        help=f"split the work into N parts, one per process or machine: part K takes a contiguous N-th of "
        f"the {unit} into OUT/part-K-of-N/; the parts read as one folder once all are done",
    )
    p.add_argument(
        "--shard-index", type=int_arg("--shard-index"), default=0, help="which part this run makes (0..N-1)"
    )


DATA_REPLICATE = "the target whole on every process, part RANK of WORLD each"


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """`--engine vllm`: the step runs on vLLM in another Python (draftsmith.data_recipes.vllm_engine);
    `auto` picks one (draftsmith.data_recipes.engine_choice)."""
    p.add_argument(
        "--engine",
        choices=["auto", "draftsmith", "vllm"],
        default="auto",
        help="auto (vLLM where it is measured faster, or on a CUDA GPU, when a Python with a fitting vLLM is "
        "found and it serves the family and step, one process: today regenerate on a CPU-only machine, "
        "both steps on a GPU; else draftsmith; the log says which and why), draftsmith (its own engine, "
        "static batches) or vllm (continuous batching / vLLM's hidden-state extraction, run by "
        "--vllm-python; `bash scripts/vllm_env.sh` builds .venv-vllm, `bash scripts/vllm_env_gpu.sh` "
        ".venv-vllm-gpu)",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        help="with --engine vllm or auto: a Python that has vLLM (default $DRAFTSMITH_VLLM_PYTHON, else "
        "./.venv-vllm-gpu/bin/python with CUDA, else ./.venv-vllm/bin/python)",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="with --engine vllm or auto: vLLM without CUDA graphs on a GPU (a CPU build always runs eager)",
    )
    declare_needs(
        p, flag_needs("--enforce-eager", "--engine vllm or auto", lambda a: a.engine != "draftsmith")
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int_arg("--tensor-parallel-size"),
        default=1,
        help="with --engine vllm: vLLM's tensor parallelism (must divide the attention heads)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int_arg("--max-num-seqs"),
        default=32,
        help="with --engine vllm: requests vLLM runs at once (its continuous batch)",
    )


def _run_data(step: str):
    def run(args: argparse.Namespace) -> None:
        import importlib

        if step in ("regenerate", "capture"):  # bad numbers exit 2 whatever the engine, before choosing one
            from draftsmith.data_recipes.step_options import check_step_options

            check_step_options(args)
        if getattr(args, "engine", "draftsmith") == "auto":  # one log line says which engine and why
            from draftsmith.data_recipes.engine_choice import choose_engine

            choose_engine(step, args)
        # --engine vllm: the step on vLLM in its own Python (data_recipes/vllm_regenerate.py, vllm_capture.py)
        name = f"vllm_{step}" if getattr(args, "engine", "draftsmith") == "vllm" else step
        module = importlib.import_module(f"draftsmith.data_recipes.{name}")
        module.run_from_args(args)

    return run
