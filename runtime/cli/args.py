"""Shared argparse pieces for the `draftsmith` verbs: the help formatter, typed flags, target flags."""

from __future__ import annotations

import argparse
import math

from draftsmith.runtime.errors import (
    BadInputError,
    check_needs,
    check_output_dir,
    check_output_file,
    flag_needs,
)


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def add_verb(
    sub, name: str, help: str, description: str | None = None, run=None, groups=()
) -> argparse.ArgumentParser:
    """One verb (or `data` step) of `sub`, shown with our help formatter: `run(args)` does its work, and
    each of `groups` (`add_x(p)`) adds its options, in the order its help lists them."""
    p = sub.add_parser(name, help=help, formatter_class=Formatter, description=description)
    if run is not None:
        p.set_defaults(run=run)
    for add_group in groups:
        add_group(p)
    return p


def add_config_args(p: argparse.ArgumentParser, config_help: str, example: str) -> None:
    """--config and the `key=value` overrides of a verb driven by a YAML config (main.py `parse_args` takes
    the overrides anywhere on the line)."""
    p.add_argument("--config", help=config_help)
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help=f"config overrides, anywhere on the line, e.g. {example}",
    )


def declare_outputs(
    p: argparse.ArgumentParser, dirs: tuple[str, ...] = (), files: tuple[str, ...] = ()
) -> None:
    """The flags that name what a verb writes: folders (`dirs`) and side files (`files`). `check_outputs`
    checks them all once after parsing, before any work, so no run loses its results to a bad path."""
    p.set_defaults(output_dirs=dirs, output_files=files)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse (exit 2) any declared output path that cannot be written: a file where a folder goes, a
    folder where a file goes, a path under a file (runtime/errors.py)."""
    checks = [(flag, check_output_dir) for flag in getattr(args, "output_dirs", ())]
    checks += [(flag, check_output_file) for flag in getattr(args, "output_files", ())]
    for flag, check in checks:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            check(flag, value)


def declare_needs(p: argparse.ArgumentParser, *rules) -> None:
    """Options of `p` that act only in one mode (runtime/errors.py `Needs`), added to its table."""
    p.set_defaults(needs=[*(p.get_default("needs") or []), *rules])


def add_mode_options(p: argparse.ArgumentParser, mode: str, is_on, options: dict[str, dict]) -> None:
    """`options` (flag -> add_argument keywords, in help order), each acting only in `mode` (`is_on(args)`
    tells whether the line asked for it): given without it, the line is refused (exit 2) before any work."""
    for flag, kwargs in options.items():
        p.add_argument(flag, **kwargs)
    declare_needs(p, *(flag_needs(flag, mode, is_on) for flag in options))


def add_switch(p: argparse.ArgumentParser, switch: str, help: str, options: dict[str, dict]) -> None:
    """An on/off `switch` and the `options` that act only when it is on (`add_mode_options`)."""
    p.add_argument(switch, action="store_true", help=help)
    dest = switch.lstrip("-").replace("-", "_")
    add_mode_options(p, switch, lambda args: getattr(args, dest), options)


def check_parsed(args: argparse.Namespace) -> None:
    """What a command line alone decides, checked once after parsing and before any work: no option
    without the mode it needs, every output path writable."""
    check_needs(args, getattr(args, "needs", ()))
    check_outputs(args)


def int_arg(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected an integer") from None

    return parse


def finite_float_arg(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected a number") from None
        if math.isnan(value):
            raise argparse.ArgumentTypeError(f"{name}: got {text!r}, expected a number, not NaN")
        return value

    return parse


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="smollm2-135m",
        help="alias (smollm2-135m, the embedded default), local HF folder, Hub id, or .gguf file",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu), float32, bfloat16")


def add_thinking_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--thinking on|off: enable_thinking for templates that read it (runtime/core/chat_template.py)."""
    p.add_argument(
        "--thinking",
        choices=["on", "off"],
        default=None,
        help=f"{what} with the chat template's thinking mode on or off (Qwen3-style templates that read "
        "enable_thinking; a target whose template has none is refused, exit 2); unset: the template's "
        "default",
    )


def add_template_check_args(p: argparse.ArgumentParser) -> None:
    """--thinking, and the override of the check of each head against the chat template it was trained
    with (runtime/heads/trained_for.py)."""
    add_thinking_arg(p, "render prompts")
    p.add_argument(
        "--allow-template-mismatch",
        action="store_true",
        help="serve a head whose recorded chat template or thinking mode differs from the target's (a "
        "warning instead of exit 2; acceptance usually drops). Heads without a record (older heads, other "
        "trainers' exports) are not checked",
    )


def needs_chat(flag: str):
    """`flag` acts on chat-templated prompts only: refused with --no-chat (nothing is rendered)."""
    return flag_needs(flag, "chat-templated prompts (no --no-chat)", lambda a: not a.no_chat)


def add_drafts_args(p: argparse.ArgumentParser, draft_help: str, tree_help: str) -> None:
    """--draft and --tree, both repeatable: the drafts a verb compares (bench, eval), each with each tree."""
    p.add_argument("--draft", action="append", default=[], help=draft_help)
    p.add_argument("--tree", action="append", default=None, help=tree_help)


def add_placement_args(p: argparse.ArgumentParser, replicate: str) -> None:
    """Where the target lives when torchrun starts the verb on several processes (runtime/core/split_run.py,
    draftsmith.data_recipes.tp_steps); `replicate` says what replicate means for the verb."""
    p.add_argument(
        "--target-placement",
        default="replicate",
        help=f"under torchrun: replicate ({replicate}), tp (each layer split over the --tp-size processes "
        "of a group whose rank 0 drives it) or ep (a MoE target's experts split over the --ep-size "
        "processes of a group, attention split where the heads allow: Qwen3-MoE, Mixtral, DeepSeek-V3)",
    )
    for size, what in (("tp", "tensor"), ("ep", "expert")):
        p.add_argument(
            f"--{size}-size",
            type=int_arg(f"--{size}-size"),
            default=None,
            help=f"processes per {what}-parallel group (unset: all); must divide the "
            f"{'heads' if size == 'tp' else 'experts'} and the processes",
        )
    p.add_argument(
        "--process-group-timeout-s",
        type=int_arg("--process-group-timeout-s"),
        default=1800,
        help="under torchrun: how long a rank waits for the others (the process group's timeout)",
    )


def split_of(args: argparse.Namespace):
    """--target-placement and its sizes -> a Split (runtime/core/split_run.py); what a split target does not
    run yet is refused here, before anything loads."""
    from draftsmith.runtime.core.split_run import Split

    split = Split(args.target_placement, args.tp_size, args.ep_size, args.process_group_timeout_s)
    if split.split:
        whole_only = {
            "--quantize": args.quantize not in (None, "none"),  # quantize_target swaps whole linears
            "--attention": args.attention != "sdpa",
        }
        why = "a split target runs eager SDPA layers at the checkpoint's precision"
        for flag, given in whole_only.items():
            if given:
                got = getattr(args, flag[2:].replace("-", "_"))
                raise BadInputError(flag, got, f"its default with --target-placement {split.placement}", why)
        args.cpu_linears = "torch"  # the W @ x^T plan is tuned on whole linears; shards keep F.linear
    return split


def add_target_runtime_args(p: argparse.ArgumentParser) -> None:
    """How a loaded target runs (generate, bench): its masked attention, its CPU linears, quantization."""
    add_attention_arg(p)
    add_cpu_linears_arg(p)
    add_quantize_args(p)


def add_attention_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attention",
        choices=["sdpa", "triton", "flex"],
        default="sdpa",
        help="the target's attention where draftsmith passes a mask (tree steps, padded batches): sdpa "
        "(default), triton (draftsmith's kernel on CUDA, its reference elsewhere) or flex (FlexAttention, "
        "compiled on CUDA); unmasked causal steps stay on SDPA",
    )


def add_cpu_linears_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cpu-linears",
        choices=["auto", "torch"],
        default="auto",
        help="fp32 linears of a CPU target over few rows: auto times F.linear against W @ x^T at 1..16 rows "
        "once per machine and target (cached under ~/.cache/draftsmith/machine) and keeps the faster per "
        "row count (runtime/core/row_linear.py); torch: F.linear everywhere",
    )


def add_quantize_args(p: argparse.ArgumentParser) -> None:
    """--quantize / --quantize-draft: weight-only quantization (runtime/core/quantize.py)."""
    modes = ["none", "int8", "int4", "fp8"]
    p.add_argument(
        "--quantize",
        choices=modes,
        default="none",
        help="weight-only quantization of the target's linears and LM head: int8 (per channel) or int4 "
        "(groups of --group-size) on a CPU, fp8 (e4m3) on CUDA with compute capability >= 8.9; speculation "
        "stays lossless against the quantized target (heads trained on the unquantized one bind to it)",
    )
    p.add_argument(
        "--group-size",
        type=int_arg("--group-size"),
        default=None,
        help="int4 inputs per scale: 32, 64, 128 or 256, dividing every layer's in_features; default 128 "
        "where it divides them, else the largest that does (SmolLM2-135M's 576: 64)",
    )
    p.add_argument(
        "--quantize-draft",
        choices=modes,
        default="none",
        help="weight-only quantization of the drafter's own linears (a head's, a model: draft LM's), never "
        "the target's; moves acceptance only",
    )
    p.add_argument(
        "--draft-group-size",
        type=int_arg("--draft-group-size"),
        default=None,
        help="--group-size for the draft",
    )
    declare_needs(
        p,
        flag_needs("--group-size", "--quantize int4", lambda a: a.quantize == "int4"),
        flag_needs("--draft-group-size", "--quantize-draft int4", lambda a: a.quantize_draft == "int4"),
    )


# ---- --draft: its help is the registry's ------------------------------------------------------------------
# The drafts without a head (runtime/drafters/drafting.py BASIC_SPECS; tests/runtime/test_cli.py checks
# that both lists name the same specs); head kinds say their own words (runtime/heads/head_kind.py `about`).
BASIC_DRAFTS = {
    "none": "plain decoding",
    "ngram": "prompt lookup",
    "suffix[:depth=D,requests=R,...]": "suffix decoding: frequency trees from the request's and earlier "
    "responses' suffix tries",
    "self:layers=N": "the target's first N layers",
    "model:TARGET": "a draft LM sharing the tokenizer",
}


def draft_help() -> str:
    """`--draft`'s help: the drafts without a head, then every registered head kind's spec and words."""
    from draftsmith.runtime.heads import head_kinds  # imports torch: only when the help is printed

    drafts = [f"{spec} ({about})" for spec, about in BASIC_DRAFTS.items()]
    drafts += [f"{kind.spec} ({kind.about})" for kind in head_kinds.KINDS.values()]
    return ", ".join(drafts)


def add_draft_arg(p: argparse.ArgumentParser) -> None:
    """`--draft SPEC`, its help filled from the registry (runtime/heads/head_kinds.py) only when printed:
    the CLI module stays free of torch (tests/test_imports.py)."""
    action = p.add_argument("--draft", default="none", help="draft spec: {drafts}")
    template, format_help = action.help, p.format_help

    def with_drafts() -> str:
        action.help = template.replace("{drafts}", draft_help())
        return format_help()

    p.format_help = with_drafts
