"""`generate`'s SSD and drafter-process flags: --ssd, --ssd-fanout, --ssd-trace, --draft-process,
--draft-device, --draft-fallback (runtime/drafters/ssd.py, runtime/drafters/draft_process.py).

    draftsmith generate --draft self:layers=10 --tree chain:3 --ssd --ssd-fanout 8 --json --prompt "Hi"
    draftsmith generate --draft self:layers=10 --tree chain:3 --draft-process --ssd --prompt "Hi"

`check_args` runs before the target loads (bad input exits 2 at once; the --ssd-trace path is checked with
every verb's outputs, runtime/cli/args.py); `build` makes the drafter; `finish` stops a drafter process and
returns the per-batch metrics `generate --json` adds to each row as "ssd"; `write_trace` writes
--ssd-trace once the rows are printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.runtime.cli.args import declare_needs, int_arg
from draftsmith.runtime.core.errors import BadInputError, flag_needs

# --ssd-fanout and --ssd-saguaro when unset (their flags default to None: set without --ssd is refused)
DEFAULT_FANOUT, DEFAULT_SAGUARO = 8, 1.0


def add_ssd_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ssd",
        action="store_true",
        help="speculative speculative decoding: pre-draft the next cycle for the predicted outcomes of this "
        "one (a chain --tree; ngram, self: or model: drafts)",
    )
    p.add_argument(
        "--ssd-fanout",
        type=int_arg("--ssd-fanout"),
        default=None,
        help=f"with --ssd: outcomes pre-drafted per cycle, spread geometrically over accepted lengths 0..K "
        f"(>= K+1); unset: {DEFAULT_FANOUT}",
    )
    p.add_argument(
        "--ssd-saguaro",
        type=float,
        default=None,
        help="with --ssd: draft-law adjustment in (0, 1]: the planned candidates' draft mass is scaled by it "
        "(sampled chains at temperature > 0), so rejections land on cached drafts; 1 = off (unset: 1)",
    )
    p.add_argument(
        "--ssd-trace",
        help="with --ssd: write one JSON line per verified cycle (the replay simulator's input), after the "
        "rows are printed",
    )
    p.add_argument(
        "--draft-process",
        action="store_true",
        help="run the drafter in its own process (torch.distributed, gloo); with --ssd it pre-drafts while "
        "the target verifies",
    )
    p.add_argument(
        "--draft-device",
        help="with --draft-process: the drafter process's device: cpu (default) or cuda[:INDEX]",
    )
    p.add_argument(
        "--draft-fallback",
        action="store_true",
        help="with --draft-process: if the drafter process dies, continue with the drafter in process (else: "
        "an error)",
    )
    ssd, process = (lambda a: a.ssd), (lambda a: a.draft_process)
    declare_needs(
        p,
        *(flag_needs(flag, "--ssd", ssd) for flag in ("--ssd-fanout", "--ssd-saguaro", "--ssd-trace")),
        *(flag_needs(flag, "--draft-process", process) for flag in ("--draft-device", "--draft-fallback")),
    )


def fanout(args) -> int:
    return DEFAULT_FANOUT if args.ssd_fanout is None else args.ssd_fanout


def saguaro(args) -> float:
    return DEFAULT_SAGUARO if args.ssd_saguaro is None else args.ssd_saguaro


def uses_ssd(args) -> bool:
    return bool(args.ssd or args.draft_process)


def check_args(args, tree, auto_depth: int) -> int:
    """-> the chain depth K. Everything that needs no target is checked here (an --ssd-* or --draft-* flag
    without --ssd / --draft-process is refused after parsing: runtime/cli/args.py check_parsed)."""
    from draftsmith.runtime.drafters.draft_process import check_draft_device, check_process_spec
    from draftsmith.runtime.drafters.drafting import default_depth
    from draftsmith.runtime.verify.ssd_fanout import check_budget
    from draftsmith.runtime.verify.tree import chain

    if args.draft == "none":
        raise BadInputError("--draft", "none", "a drafter with --ssd / --draft-process")
    if auto_depth or args.cuda_graphs:
        field, got = ("--tree", args.tree) if auto_depth else ("--cuda-graphs", True)
        raise BadInputError(field, got, "chain:K and the dynamic path with --ssd / --draft-process")
    depth = tree.max_depth if tree is not None else default_depth(args.draft)
    if tree is not None and tree != chain(depth):
        raise BadInputError("--tree", args.tree, "chain:K with --ssd / --draft-process")
    if args.ssd:
        check_budget(fanout(args), depth)
        if not 0.0 < saguaro(args) <= 1.0:  # NaN fails too
            raise BadInputError("--ssd-saguaro", args.ssd_saguaro, "a number in (0, 1] (1 = off)")
    if args.draft_process:
        check_draft_device(args.draft_device or "cpu")
        check_process_spec(args.draft)
    return depth


def build(args, target, depth: int):
    from draftsmith.runtime.drafters.draft_process import DraftConfig, RemoteDrafter
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.drafters.ssd import SsdDrafter, clone_factory
    from draftsmith.runtime.verify.tree import chain

    def in_process():
        proto = build_drafter(args.draft, target, chain(depth))
        if not args.ssd:
            return proto
        return SsdDrafter(clone_factory(proto), depth, fanout(args), saguaro=saguaro(args))

    if not args.draft_process:
        return in_process()
    config = DraftConfig(
        args.target,
        args.draft,
        depth,
        fanout(args) if args.ssd else 0,
        args.draft_device or "cpu",
        args.dtype,
        saguaro=saguaro(args),
    )
    return RemoteDrafter(config, fallback=in_process if args.draft_fallback else None)


def finish(drafter) -> list[dict]:
    """Stop a drafter process (its trace comes back with it); -> per batch metrics ([] without any)."""
    from draftsmith.runtime.drafters.draft_process import RemoteDrafter

    return drafter.close() if isinstance(drafter, RemoteDrafter) else drafter.batch_metrics()


def write_trace(args, drafter) -> None:
    """--ssd-trace: one JSON line per verified cycle, written whole (its folders created as needed)."""
    from draftsmith.runtime.core import config

    if args.ssd_trace:
        trace = getattr(drafter, "trace", None) or []
        text = "".join(json.dumps(row) + "\n" for row in trace)
        config.atomic_write_text(Path(args.ssd_trace).expanduser(), text)  # nothing half-written


def abort(drafter) -> None:
    """After an error: a drafter process must not outlive the generation."""
    from draftsmith.runtime.drafters.draft_process import RemoteDrafter

    if isinstance(drafter, RemoteDrafter) and drafter.process is not None:
        drafter.close(kill=True)
