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

from draftsmith.runtime.cli.args import int_arg
from draftsmith.runtime.core.errors import BadInputError


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
        default=8,
        help="outcomes pre-drafted per cycle, spread geometrically over accepted lengths 0..K (>= K+1)",
    )
    p.add_argument(
        "--ssd-saguaro",
        type=float,
        default=1.0,
        help="draft-law adjustment in (0, 1]: the planned candidates' draft mass is scaled by it (sampled "
        "chains at temperature > 0), so rejections land on cached drafts; 1 = off",
    )
    p.add_argument(
        "--ssd-trace", help="write one JSON line per verified cycle (the replay simulator's input)"
    )
    p.add_argument(
        "--draft-process",
        action="store_true",
        help="run the drafter in its own process (torch.distributed, gloo); with --ssd it pre-drafts while "
        "the target verifies",
    )
    p.add_argument("--draft-device", help="the drafter process's device: cpu (default) or cuda[:INDEX]")
    p.add_argument(
        "--draft-fallback",
        action="store_true",
        help="if the drafter process dies, continue with the drafter in process (else: an error)",
    )


def uses_ssd(args) -> bool:
    return bool(args.ssd or args.draft_process or args.draft_device is not None)


def check_args(args, tree, auto_depth: int) -> int:
    """-> the chain depth K. Everything that needs no target is checked here."""
    from draftsmith.runtime.drafters.draft_process import check_draft_device, check_process_spec
    from draftsmith.runtime.drafters.drafting import default_depth
    from draftsmith.runtime.verify.ssd_fanout import check_budget
    from draftsmith.runtime.verify.tree import chain

    if args.draft_device is not None and not args.draft_process:
        raise BadInputError(
            "--draft-device", args.draft_device, "--draft-process as well (the drafter's own)"
        )
    if args.draft == "none":
        raise BadInputError("--draft", "none", "a drafter with --ssd / --draft-process")
    if auto_depth or args.cuda_graphs:
        field, got = ("--tree", args.tree) if auto_depth else ("--cuda-graphs", True)
        raise BadInputError(field, got, "chain:K and the dynamic path with --ssd / --draft-process")
    depth = tree.max_depth if tree is not None else default_depth(args.draft)
    if tree is not None and tree != chain(depth):
        raise BadInputError("--tree", args.tree, "chain:K with --ssd / --draft-process")
    if args.ssd:
        check_budget(args.ssd_fanout, depth)
        if not 0.0 < args.ssd_saguaro <= 1.0:  # NaN fails too
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
        return SsdDrafter(clone_factory(proto), depth, args.ssd_fanout, saguaro=args.ssd_saguaro)

    if not args.draft_process:
        return in_process()
    fanout = args.ssd_fanout if args.ssd else 0
    config = DraftConfig(
        args.target,
        args.draft,
        depth,
        fanout,
        args.draft_device or "cpu",
        args.dtype,
        saguaro=args.ssd_saguaro,
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
