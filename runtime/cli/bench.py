"""`draftsmith bench`: the argparse shell over runtime/bench/run.py `run_bench`."""

from __future__ import annotations

import argparse
import shlex

from draftsmith.runtime.bench.types import BASELINE_KINDS, is_baseline
from draftsmith.runtime.cli import verb_texts
from draftsmith.runtime.cli.args import (
    add_drafts_args,
    add_placement_args,
    add_target_args,
    add_target_runtime_args,
    add_template_check_args,
    add_verb,
    declare_needs,
    declare_outputs,
    int_arg,
    needs_chat,
    split_of,
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


def add_placement(p: argparse.ArgumentParser) -> None:
    add_placement_args(p, "one process: the whole target")


def add_bench(sub) -> None:
    groups = (add_target_args, add_target_runtime_args, add_placement, add_method_args, add_workload_args)
    groups += (add_output_args,)
    p = add_verb(sub, "bench", *verb_texts.BENCH, run=run_bench_cli, groups=groups)
    declare_outputs(p, dirs=("--out",))
    add_template_check_args(p)  # --thinking, --allow-template-mismatch (runtime/heads/trained_for.py)
    declare_needs(p, flag_needs("--tree", "--draft", lambda a: bool(a.draft)), needs_chat("--thinking"))


def add_method_args(p: argparse.ArgumentParser) -> None:
    """The drafts timed: each --draft with each --tree (DRAFT@TREE keeps its own)."""
    add_drafts_args(
        p,
        "a draft spec (repeatable); DRAFT@TREE keeps its tree, DRAFT@TREE+graphs runs it on CUDA graphs",
        "tree spec for each draft (repeatable): chain:K, static:..., dynamic:..., auto:K (load-aware); "
        "default: chain:2 and auto:2 (depth 1 for a one-module MTP head)",
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
    p.add_argument(
        "--vllm-tp-size",
        type=int_arg("--vllm-tp-size"),
        default=1,
        help="the vllm rows' tensor parallelism (GPUs the target is split over); they run with CUDA graphs "
        "on a GPU, eager elsewhere",
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


# BenchRequest fields (runtime/bench/run.py) that are flags of the same name, passed as given
AS_GIVEN = (
    "target", "device", "dtype", "attention", "cpu_linears",  # the target and how it runs
    "quantize", "group_size", "quantize_draft", "draft_group_size",
    "prompts", "num_prompts", "max_new_tokens", "temperatures", "batch_sizes",  # the workload
    "repeats", "seed", "out", "sync_timing", "vllm_tp_size",
    "thinking", "allow_template_mismatch",  # the chat template's mode, the heads' template check
)  # fmt: skip


def run_bench_cli(args: argparse.Namespace) -> None:
    """The request, checked; then the bench on the target whole here, or split over a torchrun group whose
    rank 0 runs it (runtime/core/split_run.py; only plain and draftsmith's drafts, collectives counted)."""
    from draftsmith.runtime.bench.run import BenchRequest, check_split_methods, run_bench
    from draftsmith.runtime.core.split_run import run_split

    request = BenchRequest(
        **{name: getattr(args, name) for name in AS_GIVEN},
        drafts=args.draft,
        trees=args.tree,
        categories=[c for c in args.categories.split(",") if c] if args.categories else None,
        baselines=check_baselines([b for b in args.baselines.split(",") if b]),
        chat=not args.no_chat,
        plots=not args.no_plots,
        roofline=not args.no_roofline,
        command="draftsmith " + " ".join(shlex.quote(a) for a in args.argv),
    )
    split = split_of(args)
    if split.split:
        check_split_methods(request)
    run_split(split, "bench", args.target, args.device, args.dtype, lambda target: run_bench(request, target))
