"""`generate`'s SSD and drafter-process flags: --ssd, --ssd-fanout, --ssd-trace, --draft-process,
--draft-device, --draft-fallback (runtime/drafters/ssd.py, runtime/drafters/draft_process.py).

    draftsmith generate --draft self:layers=10 --tree chain:3 --ssd --ssd-fanout 8 --json --prompt "Hi"
    draftsmith generate --draft self:layers=10 --tree chain:3 --draft-process --ssd --prompt "Hi"

`ssd_fields` turns the flags into SpecConfig fields: runtime/speculator.py checks them before the target
loads (bad input exits 2 at once; the --ssd-trace path is checked with every verb's outputs,
runtime/cli/args.py) and builds the drafter; `Speculator.finish` stops a drafter process and returns the
per-batch metrics `generate --json` adds to each row as "ssd"; `write_trace` writes --ssd-trace once the rows
are printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.runtime.cli.args import add_switch, int_arg
from draftsmith.runtime.speculator import DraftProcess, SpecConfig

# --ssd-fanout and --ssd-saguaro when unset (their flags default to None: set without --ssd is refused)
DEFAULT_FANOUT, DEFAULT_SAGUARO = SpecConfig.ssd_fanout, SpecConfig.ssd_saguaro


SSD_OPTIONS = {
    "--ssd-fanout": dict(
        type=int_arg("--ssd-fanout"),
        default=None,
        help=f"with --ssd: outcomes pre-drafted per cycle, spread geometrically over accepted lengths 0..K "
        f"(>= K+1); unset: {DEFAULT_FANOUT}",
    ),
    "--ssd-saguaro": dict(
        type=float,
        default=None,
        help="with --ssd: draft-law adjustment in (0, 1]: the planned candidates' draft mass is scaled by it "
        "(sampled chains at temperature > 0), so rejections land on cached drafts; 1 = off (unset: 1)",
    ),
    "--ssd-trace": dict(
        help="with --ssd: write one JSON line per verified cycle (the replay simulator's input), after the "
        "rows are printed",
    ),
}
DRAFT_PROCESS_OPTIONS = {  # runtime/drafters/draft_process.py
    "--draft-device": dict(
        help="with --draft-process: the drafter process's device: cpu (default) or cuda[:INDEX]",
    ),
    "--draft-fallback": dict(
        action="store_true",
        help="with --draft-process: if the drafter process dies, continue with the drafter in process (else: "
        "an error)",
    ),
}


def add_ssd_args(p: argparse.ArgumentParser) -> None:
    """--ssd and its options, then --draft-process and its options (cli/args.py `add_switch`)."""
    ssd_help = (
        "speculative speculative decoding: pre-draft the next cycle for the predicted outcomes of this one "
        "(a chain --tree; ngram, self: or model: drafts)"
    )
    add_switch(p, "--ssd", ssd_help, SSD_OPTIONS)
    process_help = (
        "run the drafter in its own process (torch.distributed, gloo); with --ssd it pre-drafts while the "
        "target verifies"
    )
    add_switch(p, "--draft-process", process_help, DRAFT_PROCESS_OPTIONS)


def ssd_fields(args) -> dict:
    """The SSD and drafter-process flags -> SpecConfig fields (runtime/speculator.py checks and builds)."""
    process = None
    if args.draft_process:
        device = args.draft_device or DraftProcess.device
        process = DraftProcess(args.target, args.dtype, device, fallback=args.draft_fallback)
    fields = {"ssd": args.ssd, "draft_process": process}
    if args.ssd_fanout is not None:
        fields["ssd_fanout"] = args.ssd_fanout
    if args.ssd_saguaro is not None:
        fields["ssd_saguaro"] = args.ssd_saguaro
    return fields


def write_trace(args, trace: list[dict]) -> None:
    """--ssd-trace: one JSON line per verified cycle, written whole (its folders created as needed)."""
    from draftsmith.runtime.core import config

    if args.ssd_trace:
        text = "".join(json.dumps(row) + "\n" for row in trace)
        config.atomic_write_text(Path(args.ssd_trace).expanduser(), text)  # nothing half-written
