"""`draftsmith eval`: the argparse shell over runtime/bench/eval_run.py `run_eval`.

draftsmith eval --draft eagle3:heads/eagle3-smollm2-135m --draft ngram --set humaneval --json
"""

from __future__ import annotations

import argparse
import json
import shlex

from draftsmith.runtime.cli import verb_texts
from draftsmith.runtime.cli.args import (
    add_drafts_args,
    add_target_args,
    add_target_runtime_args,
    add_template_check_args,
    add_verb,
    declare_needs,
    declare_outputs,
    finite_float_arg,
    int_arg,
    needs_chat,
)
from draftsmith.runtime.cli.bench import number_list
from draftsmith.runtime.errors import BadInputError, flag_needs


def add_eval(sub) -> None:
    groups = (add_target_args, add_target_runtime_args, add_draft_args, add_harness_args, add_output_args)
    p = add_verb(sub, "eval", *verb_texts.EVAL, run=run_eval_cli, groups=groups)
    declare_outputs(p, dirs=("--out",))
    add_template_check_args(p)  # --thinking, --allow-template-mismatch (runtime/heads/trained_for.py)
    declare_needs(p, flag_needs("--tree", "--draft", lambda a: bool(a.draft)), needs_chat("--thinking"))
    declare_needs(p, flag_needs("--context-docs", "--context-lengths", lambda a: bool(a.context_lengths)))


def add_draft_args(p: argparse.ArgumentParser) -> None:
    add_drafts_args(
        p,
        "a draft spec, as generate takes it (repeatable: the leaderboard ranks them); DRAFT@TREE keeps "
        "its tree",
        "tree for each draft without @TREE (repeatable): chain:K, static:..., dynamic:...; default: the "
        "draft's own chain (generate's)",
    )


def add_harness_args(p: argparse.ArgumentParser) -> None:
    """The pinned harness: sets, prompts, sampling, length (all recorded in the output)."""
    p.add_argument(
        "--set",
        action="append",
        default=None,
        help="an eval set NAME[/CONFIG][@REVISION][:FILE] (repeatable): speed-bench (/qualitative, "
        "/throughput_1k ... _32k), gsm8k, mt-bench, math-500, humaneval, mbpp; or a bench prompt source "
        "(sharegpt, jsonl:FILE, mtbench:FILE). Default: humaneval",
    )
    p.add_argument("--num-prompts", type=int_arg("--num-prompts"), default=20, help="per set")
    p.add_argument("--categories", help="comma-separated categories to keep")
    p.add_argument("--max-new-tokens", type=int_arg("--max-new-tokens"), default=128)
    p.add_argument(
        "--temperatures", type=number_list("--temperatures", float), default=[0.0], help="e.g. 0,1"
    )
    p.add_argument("--top-p", type=finite_float_arg("--top-p"), default=1.0)
    p.add_argument("--top-k", type=int_arg("--top-k"), default=0)
    p.add_argument("--seed", type=int_arg("--seed"), default=0)
    p.add_argument(
        "--batch-size",
        type=int_arg("--batch-size"),
        default=16,
        help="prompts decoded together (speed only: the record does not depend on it at T = 0)",
    )
    p.add_argument("--no-chat", action="store_true", help="feed prompts as they are")
    p.add_argument(
        "--engine-at-t0",
        action="store_true",
        help="at T = 0 decode every draft through the runtime's engine (a target forward per cycle) rather "
        "than replay it against the target's greedy continuation, decoded once per set (the default: the "
        "same acceptance, but for floating-point near-ties; runtime/bench/eval_replay.py)",
    )
    p.add_argument(
        "--context-lengths",
        type=number_list("--context-lengths", int),
        help="acceptance against context length, e.g. 2048,4096,8192: long documents cut to each length "
        "(prompt + --max-new-tokens), then a question; at most the target's context (instead of --set)",
    )
    p.add_argument(
        "--context-docs",
        help="the long documents: sharegpt (held-out conversations, default), text:FILE, or an eval set "
        "such as speed-bench/throughput_8k[:FILE]",
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/eval", help="output folder: eval.json, report.md, plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result (eval.json) on stdout")


AS_GIVEN = (
    "target", "device", "dtype", "attention", "cpu_linears", "quantize", "group_size", "quantize_draft",
    "draft_group_size",
    "num_prompts", "max_new_tokens", "temperatures", "top_p", "top_k", "seed", "batch_size", "out",
    "thinking", "allow_template_mismatch",  # the chat template's mode, the heads' template check
    "engine_at_t0",
)  # fmt: skip


def run_eval_cli(args: argparse.Namespace) -> None:
    from draftsmith.runtime.bench.eval_run import EvalRequest, run_eval

    request = EvalRequest(
        **{name: getattr(args, name) for name in AS_GIVEN},
        drafts=args.draft,
        trees=args.tree,
        sets=args.set or ["humaneval"],
        categories=[c for c in args.categories.split(",") if c] if args.categories else None,
        chat=not args.no_chat,
        plots=not args.no_plots,
        command="draftsmith " + " ".join(shlex.quote(a) for a in args.argv),
        context_lengths=args.context_lengths,
        context_docs=args.context_docs or "sharegpt",
    )
    for flag, given in (("--set", args.set), ("--categories", args.categories)):
        if given and args.context_lengths:
            raise BadInputError(flag, given, "no " + flag + " with --context-lengths (--context-docs)")
    result = run_eval(request)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for temperature, rows in result["leaderboard"].items():
            ranked = [f"{r['rank']}. {r['method']} AL {r['mean_acceptance_length']}" for r in rows]
            print(f"T={temperature}: " + "; ".join(ranked), flush=True)
