"""`draftsmith calibrate`: the argparse shell over runtime/bench/calibrate.py `calibrate`.

draftsmith calibrate --draft dspark:runs/dspark-smollm2-135m/final --out runs/dspark-smollm2-135m/calibrated
"""

from __future__ import annotations

import argparse
import json
import shlex

from draftsmith.runtime.cli import verb_texts
from draftsmith.runtime.cli.args import (
    add_target_args,
    add_verb,
    declare_outputs,
    finite_float_arg,
    int_arg,
)


def add_calibrate(sub) -> None:
    p = add_verb(sub, "calibrate", *verb_texts.CALIBRATE, run=run_calibrate_cli, groups=(add_target_args,))
    p.add_argument("--draft", required=True, help="dspark:DIR, the head to calibrate (left as it is)")
    p.add_argument(
        "--out",
        required=True,
        help="the calibrated head's folder: new, empty, or an earlier calibrate output (replaced)",
    )
    p.add_argument(
        "--prompts",
        default="sharegpt-train",
        help="sharegpt-train (first user turns of the conversations recipes train on), jsonl:FILE, or "
        "any bench source; not the held-out slice you will bench on",
    )
    p.add_argument("--num-prompts", type=int_arg("--num-prompts"), default=96)
    p.add_argument(
        "--validation-fraction",
        type=finite_float_arg("--validation-fraction"),
        default=0.25,
        help="the last share of the prompts, kept out of the fit to report it on",
    )
    p.add_argument("--max-new-tokens", type=int_arg("--max-new-tokens"), default=96, help="per prompt")
    p.add_argument("--depth", type=int_arg("--depth"), help="the chain drafted (default: generate's)")
    p.add_argument("--batch-size", type=int_arg("--batch-size"), default=16)
    p.add_argument("--no-chat", action="store_true", help="feed prompts as they are")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", action="store_true", help="print calibration.json on stdout")
    declare_outputs(p, dirs=("--out",))


AS_GIVEN = ("draft", "out", "target", "device", "dtype", "prompts", "num_prompts", "validation_fraction",
            "max_new_tokens", "depth", "batch_size")  # fmt: skip


def run_calibrate_cli(args: argparse.Namespace) -> None:
    from draftsmith.runtime.bench.calibrate import CalibrateRequest, calibrate

    request = CalibrateRequest(
        **{name: getattr(args, name) for name in AS_GIVEN},
        chat=not args.no_chat,
        plots=not args.no_plots,
        command="draftsmith " + " ".join(shlex.quote(a) for a in args.argv),
    )
    record = calibrate(request)
    if args.json:
        print(json.dumps(record), flush=True)
        return
    print(f"scale {record['scale']:.4f}, shift {record['shift']:.4f} -> {args.out}", flush=True)
    for split in ("fit", "validation"):
        r = record[split]
        print(
            f"{split}: {r['prompts']} prompts, {r['slots']} slots, AUROC {r['auroc']}, ECE "
            f"{r['before']['calibration_error']} -> {r['after']['calibration_error']}; per position "
            f"predicted {r['after']['predicted_accept_per_position']} observed "
            f"{r['after']['observed_accept_per_position']}",
            flush=True,
        )
