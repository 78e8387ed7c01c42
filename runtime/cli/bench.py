"""`draftsmith bench`: the argparse shell over runtime/bench/run.py `run_bench`."""

from __future__ import annotations

import argparse
import shlex

from draftsmith.runtime.bench.types import BASELINE_KINDS, is_baseline
from draftsmith.runtime.cli.args import (
    Formatter,
    add_attention_arg,
    add_cpu_linears_arg,
    add_quantize_args,
    add_target_args,
    declare_needs,
    declare_outputs,
    int_arg,
)
from draftsmith.runtime.errors import BadInputError, flag_needs


def number_list(name: str, kind):
    def parse(text: str):
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name}: got {text!r}, expected comma-separated numbers"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected at least one value")
        return values

    return parse


def check_baselines(names: list[str]) -> list[str]:
    for name in names:
        if not is_baseline(name):
            raise BadInputError("--baselines", name, f"a comma-separated list of {', '.join(BASELINE_KINDS)}")
    return names


BENCH_DESCRIPTION = (
    "Decode the same prompts with plain decoding, the baselines and every --draft (combined with\n"
    "every --tree), per temperature and batch size: warm-up first, methods interleaved per batch,\n"
    "repeats with medians. Prints a table per block and writes OUT/results.json (one row per\n"
    "method, temperature and batch size: tokens/s, speedup over plain, tau, acceptance per\n"
    "position, TTFT/TPOT, greedy_identical at T=0), OUT/meta.json (command, versions, machine,\n"
    "roofline), OUT/report.md and PNG plots.\n\n"
    "Tree auto:K is load-aware speculation: the engine measures its verify-cost curve at start-up\n"
    "and drafts a chain of depth 0..K per cycle, whichever gives the most expected tokens per\n"
    "second for the acceptance it observes (0 = a plain step), so speculation never costs much\n"
    "more than plain decoding even where verification is compute-bound.\n\n"
    "examples:\n"
    "  draftsmith bench --draft ngram --prompts humaneval --num-prompts 20\n"
    "  draftsmith bench --draft eagle3:runs/eagle3-smollm2-135m/final --tree chain:2 \\\n"
    "      --tree auto:3 \\\n"
    "      --prompts sharegpt --temperatures 0,1 --batch-sizes 1,4,16\n"
    "  draftsmith bench --draft 'self:layers=20@chain:2' --prompts mtbench:question.jsonl \\\n"
    "      --categories coding,math --baselines plain,hf,vllm\n"
    "  draftsmith bench --draft eagle3:HEAD --baselines plain,vllm,vllm-eagle3:HEAD@chain:2\n"
    "  draftsmith bench --draft ngram --baselines plain,llamacpp,llamacpp-lookup --batch-sizes 1\n"
    "  draftsmith bench --device cuda --baselines plain,plain+graphs \\\n"
    "      --draft 'eagle3:HEAD@chain:3+graphs'\n\n"
    "A +graphs suffix runs plain or DRAFT@TREE on the GPU engine path (static KV cache,\n"
    "CUDA graphs). llamacpp[:GGUF] runs llama.cpp (bash scripts/setup_llamacpp.sh) on the GGUF the\n"
    "target came from, or on GGUF; rows name its precision (weights: Q4_1, Q8_0, F32).\n"
    "A +ssd[:F] suffix (DRAFT@chain:K+ssd:8) runs the draft through SSD in process\n"
    "(generate --ssd).\n"
    "Speculative rows carry draft and verify ms per cycle (mean), the draft share of wall time, and\n"
    "for +ssd the hit rate per accepted length, draft latency hidden and target idle time."
)


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="speed of drafts side by side with plain decoding, transformers and vLLM",
        formatter_class=Formatter,
        description=BENCH_DESCRIPTION,
    )
    add_target_args(p)
    add_attention_arg(p)
    add_cpu_linears_arg(p)
    add_quantize_args(p)
    add_method_args(p)
    add_workload_args(p)
    add_output_args(p)
    declare_outputs(p, dirs=("--out",))
    declare_needs(p, flag_needs("--tree", "--draft", lambda a: bool(a.draft)))
    p.set_defaults(run=run_bench_cli)


def add_method_args(p: argparse.ArgumentParser) -> None:
    """The drafts timed: each --draft with each --tree (DRAFT@TREE keeps its own)."""
    p.add_argument(
        "--draft",
        action="append",
        default=[],
        help="a draft spec (repeatable); DRAFT@TREE keeps its tree, DRAFT@TREE+graphs runs it on CUDA graphs",
    )
    p.add_argument(
        "--tree",
        action="append",
        default=None,
        help="tree spec for each draft (repeatable): chain:K, "
        "static:..., dynamic:..., auto:K (load-aware); default: chain:2 and auto:2 (depth 1 for a one-module "
        "MTP head)",
    )


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """What every method decodes (prompts, lengths, temperatures, batch sizes), the --baselines beside the
    drafts, repeats and seed."""
    p.add_argument(
        "--prompts",
        default="sharegpt",
        help="sharegpt (held-out slice), humaneval, mtbench:FILE, specbench:FILE, jsonl:FILE",
    )
    p.add_argument("--num-prompts", type=int_arg("--num-prompts"), default=8)
    p.add_argument("--categories", help="comma-separated categories to keep (mtbench/specbench files)")
    p.add_argument("--max-new-tokens", type=int_arg("--max-new-tokens"), default=64)
    p.add_argument(
        "--temperatures", type=number_list("--temperatures", float), default=[0.0], help="e.g. 0,1"
    )
    p.add_argument(
        "--batch-sizes",
        type=number_list("--batch-sizes", int),
        default=None,
        help="e.g. 1,4,16; default 1,2,4,...,64 on a GPU and 1,4,16 on a CPU",
    )
    p.add_argument(
        "--baselines",
        default="plain,hf,hf-prompt-lookup",
        help=f"comma-separated: {', '.join(BASELINE_KINDS)}",
    )
    p.add_argument(
        "--repeats", type=int_arg("--repeats"), default=1, help="timed runs per batch; the median counts"
    )
    p.add_argument("--seed", type=int_arg("--seed"), default=0)
    p.add_argument(
        "--no-chat", action="store_true", help="feed prompts as they are (single-turn sources only)"
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    """Where the rows go, what else is measured and how phases are timed."""
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring bandwidth and matmul rate")
    p.add_argument("--out", default="runs/bench", help="output folder")
    p.add_argument(
        "--sync-timing",
        action="store_true",
        help="on CUDA, synchronize at each draft / verify phase boundary so every kernel counts in the phase "
        "that launched it (costs a stall per phase; CPU runs are exact without it)",
    )


def run_bench_cli(args: argparse.Namespace) -> None:
    from draftsmith.runtime.bench.run import BenchRequest, run_bench

    request = BenchRequest(
        target=args.target,
        drafts=args.draft,
        trees=args.tree,
        prompts=args.prompts,
        num_prompts=args.num_prompts,
        categories=[c for c in args.categories.split(",") if c] if args.categories else None,
        max_new_tokens=args.max_new_tokens,
        temperatures=args.temperatures,
        batch_sizes=args.batch_sizes,
        baselines=check_baselines([b for b in args.baselines.split(",") if b]),
        repeats=args.repeats,
        seed=args.seed,
        chat=not args.no_chat,
        out=args.out,
        plots=not args.no_plots,
        roofline=not args.no_roofline,
        device=args.device,
        dtype=args.dtype,
        attention=args.attention,
        cpu_linears=args.cpu_linears,
        quantize=args.quantize,
        group_size=args.group_size,
        quantize_draft=args.quantize_draft,
        draft_group_size=args.draft_group_size,
        sync_timing=args.sync_timing,
        command="draftsmith " + " ".join(shlex.quote(a) for a in args.argv),
    )
    run_bench(request)
