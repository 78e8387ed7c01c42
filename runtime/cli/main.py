"""The `draftsmith` command: one console script, one verb per job, lazy imports per verb.

    draftsmith generate --prompt "What is speculative decoding?" --json
    draftsmith demo --quick

Every verb is a thin shell over a library function. Exit codes: 0 success, 2 bad input (the message names
the field, what it got and what it expected), 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time

from draftsmith.runtime.cli import verb_texts
from draftsmith.runtime.cli.args import (
    Formatter,
    add_config_args,
    add_draft_arg,
    add_placement_args,
    add_target_args,
    add_target_runtime_args,
    add_template_check_args,
    add_verb,
    check_parsed,
    declare_needs,
    declare_outputs,
    finite_float_arg,
    int_arg,
    needs_chat,
    split_of,
)
from draftsmith.runtime.cli.bench import add_bench
from draftsmith.runtime.cli.calibrate import add_calibrate
from draftsmith.runtime.cli.data import add_data
from draftsmith.runtime.cli.eval import add_eval
from draftsmith.runtime.cli.export import add_export
from draftsmith.runtime.cli.ssd import add_ssd_args, ssd_fields, write_trace
from draftsmith.runtime.errors import BadInputError, DraftsmithError, flag_needs

log = logging.getLogger("draftsmith")

SERVE_REPLICATE = "one process: the whole target"
TREE_HELP = (
    "chain:K, static:NAME (binary-3, wide-4, deep-6) or static:JSON (paths of child ranks or parent ids), "
    "dynamic:depth=D,topk=K,tokens=N (EAGLE-2 style, grown each cycle), auto:K (load-aware: a chain of "
    "depth 0..K per cycle from the measured verify cost and the observed acceptance; 0 = a plain step), "
    "adaptive:K (auto:K's depth, then each row verifies the prefix of it that pays best per measured verify "
    "cost, from the drafter's confidence or the observed acceptance)"
)


def add_generate(sub) -> None:
    groups = (add_target_args, add_speculation_args, add_decoding_args, add_prompt_args)
    p = add_verb(sub, "generate", *verb_texts.GENERATE, run=run_generate, groups=groups)
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="the GPU engine path: preallocated KV caches and one CUDA graph per (batch, tokens) shape for "
        "the target's verification and the drafter's steps (on a CPU the same static path runs without "
        "graphs)",
    )
    add_target_runtime_args(p)  # --attention, --cpu-linears, --quantize and its options (cli/args.py)
    add_placement_args(p, SERVE_REPLICATE)  # torchrun: the target split over a group (core/split_run.py)
    add_ssd_args(p)  # runtime/cli/ssd.py
    add_template_check_args(p)  # --thinking, --allow-template-mismatch (runtime/heads/trained_for.py)
    declare_outputs(p, files=("--ssd-trace",))
    declare_needs(p, flag_needs("--tree", "--draft", lambda a: a.draft != "none"), needs_chat("--thinking"))


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    """--draft and --tree: what to draft each cycle."""
    add_draft_arg(p)  # its help lists the registry's head kinds (runtime/cli/args.py)
    p.add_argument(
        "--tree",
        help=f"what to draft each cycle: {TREE_HELP}. Unset: chain:2 (chain:1 for a one-module MTP head), "
        "which suits CPUs: verifying 3 nodes (chain:2) costs 1.26x one token there, 4 nodes 1.7x, 8 nodes "
        "2.1x (BENCHMARKS.md); on GPUs larger trees pay",
    )


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """Sampling, length, seed, chat template and batch size."""
    p.add_argument("--temperature", type=finite_float_arg("--temperature"), default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=finite_float_arg("--top-p"), default=1.0, help="nucleus mass, in (0, 1]")
    p.add_argument(
        "--top-k", type=int_arg("--top-k"), default=0, help="keep the k most likely tokens; 0 = off"
    )
    p.add_argument("--max-new-tokens", type=int_arg("--max-new-tokens"), default=128)
    p.add_argument(
        "--seed", type=int_arg("--seed"), default=0, help="row i samples with a generator seeded by (seed, i)"
    )
    p.add_argument("--no-chat", action="store_true", help="feed the prompt text as is (no chat template)")
    p.add_argument(
        "--batch-size",
        type=int_arg("--batch-size"),
        default=1,
        help="prompts decoded together (left padding)",
    )


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    """Where the prompts come from, and how the rows are printed."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts", help="file: one prompt per line, or JSONL with a 'prompt' field")
    p.add_argument("--json", action="store_true", help="print JSON Lines instead of text")


def run_generate(args: argparse.Namespace) -> None:
    """Checks that need no target, then the work on the target: whole here, or split over a torchrun
    group whose rank 0 runs it (the other ranks follow; only rank 0 prints)."""
    from draftsmith.runtime.core.quantize import parse_quantize
    from draftsmith.runtime.core.split_run import run_split

    cfg = spec_config(args)  # every check that needs no target, before it loads
    params, texts = generate_inputs(args)
    quant = parse_quantize(args.quantize, args.group_size)  # runtime/core/quantize.py
    split = split_of(args)

    def work(target) -> None:
        generate_on(args, target, cfg, params, texts, quant)

    run_split(split, "generate", args.target, args.device, args.dtype, work)


def generate_on(args: argparse.Namespace, target, cfg, params, texts: list[str], quant) -> None:
    from draftsmith.runtime.core.chat_template import thinking_arg, use_thinking
    from draftsmith.runtime.core.collectives import CollectiveCounter
    from draftsmith.runtime.heads.trained_for import check_drafts
    from draftsmith.runtime.speculator import build_speculator, prepare_target

    use_thinking(target, thinking_arg(args.thinking, "--thinking"))  # exit 2 where the template has none
    check_drafts([args.draft], target, args.allow_template_mismatch, chat=not args.no_chat)
    cfg.rows_plan = prepare_target(target, quant, args.attention, args.cpu_linears)
    prompt_ids = [target.encode(t, chat=not args.no_chat) for t in texts]
    cfg.batch_sizes = sorted({min(args.batch_size, len(prompt_ids)), 1})  # auto:K's cost curve
    speculator = build_speculator(target, cfg)
    counter = CollectiveCounter() if target.tp_size > 1 else None  # a split target's collectives
    run = dict(max_new_tokens=args.max_new_tokens, seed=args.seed, batch_size=args.batch_size)
    start = time.perf_counter()
    with counter or contextlib.nullcontext():
        results = speculator.generate(prompt_ids, params, **run, progress=not args.json, collectives=counter)
    wall = time.perf_counter() - start
    if (policy := speculator.policies.get(args.batch_size)) is not None:
        log.info("load-aware depth counts (0..%d): %s", speculator.max_depth, policy.depth_counts)
    ssd_metrics = speculator.finish()  # hit rates, hidden draft time, target idle ([] without SSD)
    collectives = log_collectives(counter)
    print_rows(args, target, texts, results, ssd_metrics, collectives)
    log_totals(results, wall)
    if cfg.chained:  # side files after the rows: a late failure here loses no generated text
        write_trace(args, speculator.trace)


def log_collectives(counter) -> dict | None:
    """A split target's collectives per cycle (runtime/core/collectives.py), logged -> --json's object."""
    if counter is None:
        return None
    from draftsmith.runtime.core.collectives import per_cycle

    found = per_cycle(counter.report())
    for phase, kinds in found["per_cycle"].items():
        said = ", ".join(f"{v['count']:g} {k} ({v['bytes']:.0f} B)" for k, v in kinds.items()) or "none"
        log.info("collectives per cycle, %s: %s", phase, said)
    return found


def spec_config(args: argparse.Namespace):
    """generate's speculation flags -> a checked SpecConfig (runtime/speculator.py)."""
    from draftsmith.runtime.speculator import SpecConfig

    cfg = SpecConfig(
        args.draft,
        args.tree,
        static=args.cuda_graphs,
        quantize_draft=args.quantize_draft,
        draft_group_size=args.draft_group_size,
        **ssd_fields(args),
    )
    return cfg.validate()


def generate_inputs(args: argparse.Namespace):
    """-> (the sampling parameters, the prompt texts), checked."""
    from draftsmith.runtime.core.prompts import read_prompts_file
    from draftsmith.runtime.verify.sampling import SamplingParams

    params = SamplingParams(args.temperature, args.top_p, args.top_k).validate()
    if args.max_new_tokens < 1:
        raise BadInputError("--max-new-tokens", args.max_new_tokens, "an integer >= 1")
    if args.batch_size < 1:
        raise BadInputError("--batch-size", args.batch_size, "an integer >= 1")
    texts = [args.prompt] if args.prompt is not None else read_prompts_file(args.prompts)
    return params, texts


def print_rows(
    args: argparse.Namespace, target, texts: list[str], results, ssd_metrics: list[dict], collectives=None
) -> None:
    """The generated text, or with --json one row per prompt (SSD's metrics on the rows of each batch; a
    split target's collectives per cycle, the run's, on every row)."""
    for i, (text, res) in enumerate(zip(texts, results, strict=True)):
        if args.json:
            row = result_row(target, text, res)
            if i // args.batch_size < len(ssd_metrics):
                row["ssd"] = ssd_metrics[i // args.batch_size]
            if collectives is not None:
                row["collectives"] = collectives
            print(json.dumps(row), flush=True)
        else:
            print(target.decode(res.token_ids), end="\n\n" if len(results) > 1 else "\n", flush=True)


def log_totals(results, wall: float) -> None:
    """One log line: prompts, new tokens, tokens/s, target forwards, tau and acceptance per position."""
    from draftsmith.runtime.core.engine import accept_rates

    new = sum(r.new_tokens for r in results)
    forwards = sum(r.target_forwards for r in results)
    rates = accept_rates(
        [a for r in results for a in r.accepted_lengths], [d for r in results for d in r.draft_depths]
    )
    log.info(
        "%d prompt(s), %d new tokens in %.2f s (%.1f tok/s), %d target forwards, tau %.2f%s",
        len(results),
        new,
        wall,
        new / wall,
        forwards,
        new / max(forwards, 1),
        f", acceptance per position {[round(r, 2) for r in rates]}" if rates else "",
    )


def result_row(target, prompt: str, res) -> dict:
    return {
        "prompt": prompt,
        "prompt_token_ids": res.prompt_token_ids,
        "token_ids": res.token_ids,
        "text": target.decode(res.token_ids),
        "new_tokens": res.new_tokens,
        "finish_reason": res.finish_reason,
        "target_forwards": res.target_forwards,
        "draft_forwards": res.draft_forwards,
        "mean_accepted": round(res.mean_accepted, 4),  # tau: 1.0 for plain decoding
        "accept_rate_per_position": [round(r, 4) for r in res.accept_rate_per_position],
        "cycles": len(res.accepted_lengths),
        "accepted_lengths": res.accepted_lengths,  # per cycle (replays: runtime/bench/ssd_replay.py)
        "wall_s": round(res.wall_s, 4),
        "tokens_per_s": round(res.new_tokens / res.wall_s, 3),
        # this row's cycles, each the whole batch's (runtime/core/cycle_timing.py): summed draft / verify time
        "draft_s": round(sum(res.cycle_draft_s), 4),
        "verify_s": round(sum(res.cycle_verify_s), 4),
    }


def add_demo(sub) -> None:
    p = add_verb(sub, "demo", *verb_texts.DEMO, run=run_demo)
    add_config_args(p, "YAML demo config (default: the packaged demo-smollm2-135m.yaml)", "num_prompts=20")
    p.add_argument("--quick", action="store_true", help="a 40-step head and 4 prompts x 32 tokens")
    p.add_argument("--train", action="store_true", help="train a new head (train_config) instead of `head`")


def run_demo(args: argparse.Namespace) -> None:
    from draftsmith.runtime.cli.demo import demo_main

    demo_main(args.config, args.overrides, quick=args.quick, train=args.train)


def add_train(sub) -> None:
    p = add_verb(sub, "train", *verb_texts.TRAIN, run=run_train)
    add_config_args(p, "YAML train config, e.g. configs/eagle3-smollm2-135m.yaml", "train.lr=1e-4")
    p.add_argument(
        "--preflight",
        action="store_true",
        help="print the memory estimate per rank for each strategy and exit: no weights or data are read "
        "(target= a model folder, a config.json, a Hub id or one under configs/targets/)",
    )
    p.add_argument(
        "--world-size",
        type=int_arg("--world-size"),
        help="--preflight: ranks to estimate for (default: WORLD_SIZE, the GPUs here, else 8)",
    )
    declare_needs(p, flag_needs("--world-size", "--preflight", lambda a: a.preflight))


def run_train(args: argparse.Namespace) -> None:
    from draftsmith.train.config import load_train_config

    if args.preflight:
        from draftsmith.train.preflight.plan import preflight_report

        if args.world_size is not None and args.world_size < 1:
            raise BadInputError("--world-size", args.world_size, "an integer >= 1")
        print(preflight_report(load_train_config(args.config, args.overrides), args.world_size), flush=True)
        return
    if args.config is None:
        raise BadInputError("--config", None, "a YAML train config (optional only with --preflight)")
    from draftsmith.train.loop.trainer import train

    train(load_train_config(args.config, args.overrides))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftsmith",
        description="Train, export and losslessly serve speculative-decoding draft heads.",
        formatter_class=Formatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    add_generate(sub)
    add_bench(sub)
    add_eval(sub)
    add_calibrate(sub)
    add_data(sub)
    add_train(sub)
    add_export(sub)
    add_demo(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse, with a verb's key=value overrides taken anywhere on the line (`train a=1 --config C b=2`):
    argparse takes the first run of positionals only, so the later ones come back unknown and join the
    overrides in the order typed (the last of a key wins). Anything else unknown is refused as before."""
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *(a for a in extra if not a.startswith("-"))]
        extra = [a for a in extra if a.startswith("-")]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to sys.stderr as it is when a record is emitted, not as it was when the handler
    was made: a caller that swaps stderr (a redirect, pytest's capture) never leaves our log writing to a
    closed stream ("--- Logging error ---" in front of the next error line)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler.__init__ sets it; the property decides
        pass


def setup_logging(verbose: bool) -> None:
    """Our loggers (draftsmith.*) print `draftsmith: message` lines to the current stderr."""
    logger = logging.getLogger("draftsmith")
    handler = CurrentStderr()
    handler.setFormatter(logging.Formatter("draftsmith: %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as exit_:  # --help (0) or a malformed flag (2): argparse has printed why
        return int(exit_.code or 0)
    setup_logging(args.verbose)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # what reports quote as the command
    try:
        check_parsed(args)  # options without their mode, output paths: before any work (cli/args.py)
        args.run(args)
    except DraftsmithError as err:
        print(f"draftsmith {args.verb}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def exit_with(code: int) -> None:
    """Leave with main's exit code; under torchrun (a split target, data steps on a TP group) through
    os._exit: gloo may abort in a subgroup's destructor at interpreter exit, after the work is done (as
    train/__main__.py, which leaves the same way)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_with(main())
