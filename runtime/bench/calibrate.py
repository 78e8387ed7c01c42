"""`draftsmith calibrate`: Platt scaling of a DSpark head's confidence head, fitted on the target's own
greedy continuations of prompts from the head's training range, folded into a copy of the head.

    fit = calibrate(CalibrateRequest(draft="dspark:runs/dspark/final", out="runs/dspark/calibrated"))
    fit["validation"]["after"]["calibration_error"]      # ECE on prompts the fit did not see

Why. The confidence head learns the realized acceptance 1 - TVD on the training data, answers written by
other models; the runtime asks it about the target's own continuations, which the head predicts better
(BENCHMARKS.md, issue 43: the recipe head predicts 0.13-0.14 at position 1 where 0.19-0.21 is observed,
ECE 0.065-0.07). The levels are off, the ranking is not; a monotone map fitted where the head is used
fixes the levels and keeps the ranking (runtime/verify/recalibration.py), so the adaptive rule's
expected-accepted-tokens arithmetic reads true probabilities.

How:
1. prompts from `--prompts` (default `sharegpt-train`: first user turns of the conversations the recipes
   train on, never the held-out slice `bench --prompts sharegpt` reads), split by prompt: the last
   `validation_fraction` validate;
2. the target decodes each greedily once (eval's teacher-forced continuation, runtime/bench/eval_replay.py)
   and the head drafts a chain against it as the runtime would at T = 0; each reached node's (survival,
   accepted) pair is kept (`SurvivalPairs`: bench's calibration event);
3. (scale, shift) minimize the cross-entropy on the fit split; both splits report the ECE before and
   after and the AUROC (the same before and after: the map is increasing);
4. OUT is the head folder with its two confidence tensors rewritten (runtime/heads/dspark.py
   `platt_folded`; exports carry them), `calibration.json` (the fit, both splits, the command) and
   `reliability.png`, written in a temporary folder renamed into place: a killed run leaves no half head.
The fit is at T = 0 (the outcome: the draft's token is the target's argmax); the head is trained on the
T = 1 acceptance, and `bench --temperatures 0,1` reads both.
Tests: tests/runtime/test_recalibration.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")
FIELDS = ("calibration_error", "reliability", "predicted_accept_per_position", "observed_accept_per_position")


@dataclass
class CalibrateRequest:
    draft: str  # dspark:DIR
    out: str  # the calibrated head's folder
    target: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "auto"
    prompts: str = "sharegpt-train"
    num_prompts: int = 96
    validation_fraction: float = 0.25
    max_new_tokens: int = 96
    depth: int | None = None  # the chain drafted: None = the draft's default (generate's)
    batch_size: int = 16
    chat: bool = True
    plots: bool = True
    command: str = ""


def check_request(req: CalibrateRequest) -> Path:
    """-> the head's folder; bad input refused before the target loads."""
    from draftsmith.runtime.heads import head_kinds

    found = head_kinds.draft_kind(req.draft)
    if found is None or not found[0].confidence:
        kinds = [f"{k.name}:DIR" for k in head_kinds.KINDS.values() if k.confidence]
        raise BadInputError("--draft", req.draft, f"a head with a confidence head ({', '.join(kinds)})")
    folder = Path(found[1].partition("#")[0]).expanduser()
    if not (folder / "model.safetensors").is_file():
        raise BadInputError("--draft", req.draft, "a DSpark head folder holding model.safetensors")
    out = Path(req.out).expanduser().resolve()
    if out == folder.resolve() or folder.resolve().is_relative_to(out):
        raise BadInputError("--out", req.out, "a new folder, not the head's own (the input stays as it was)")
    if out.is_dir() and any(out.iterdir()) and not (out / "calibration.json").is_file():
        raise BadInputError(
            "--out", req.out,
            "a new or empty folder, or an earlier calibrate output (it holds calibration.json): nothing else "
            "is replaced",
        )  # fmt: skip
    if not 0 < req.validation_fraction < 1:
        raise BadInputError("--validation-fraction", req.validation_fraction, "a number in (0, 1)")
    if req.num_prompts < 4:
        raise BadInputError(
            "--num-prompts", req.num_prompts, "at least 4 (a fit split and a validation split)"
        )
    return folder


def calibrate(req: CalibrateRequest, target=None) -> dict:
    """Fit, fold, write OUT -> the record written to OUT/calibration.json."""
    from draftsmith.runtime.bench.prompt_sets import load_prompt_set
    from draftsmith.runtime.core.target import Target

    folder = check_request(req)
    texts = load_prompt_set(req.prompts, req.num_prompts)  # before the target loads
    target = target or Target.load(req.target, device=req.device, dtype=req.dtype)
    return calibrate_on(req, target, folder, [target.encode(t, chat=req.chat) for t in texts])


def calibrate_on(req: CalibrateRequest, target, folder: Path, ids: list[list[int]]) -> dict:
    """`calibrate` on tokenized prompts."""
    from draftsmith.runtime.bench.eval_replay import TeacherForced, replay
    from draftsmith.runtime.drafters.drafting import build_drafter, default_depth
    from draftsmith.runtime.verify.recalibration import SurvivalPairs, fit_platt
    from draftsmith.runtime.verify.tree import parse_tree_spec

    depth = req.depth or default_depth(req.draft)
    cut = len(ids) - max(1, round(len(ids) * req.validation_fraction))
    splits = {}
    for name, part in (("fit", ids[:cut]), ("validation", ids[cut:])):
        log.info(
            "calibrate: %s split, %d prompts: greedy continuations, then chain:%d drafts",
            name,
            len(part),
            depth,
        )
        drafter = build_drafter(req.draft, target, parse_tree_spec(f"chain:{depth}"))  # fresh per split
        tf = TeacherForced.decode(
            target, part, req.max_new_tokens, depth, req.batch_size, drafter.capture_layers
        )
        pairs = SurvivalPairs()
        replay(drafter, drafter.tree, tf, req.batch_size, calibration=pairs)
        splits[name] = (pairs.predicted(), pairs.outcome(), pairs.depths(), len(part))
    scale, shift = fit_platt(*splits["fit"][:2])
    log.info("calibrate: scale %.4f, shift %.4f from %d slots", scale, shift, len(splits["fit"][0]))
    record = {
        "scale": scale,
        "shift": shift,
        "map": "survival -> sigmoid(scale * logit(survival) + shift), folded into confidence_head.proj",
        "event": "a drafted node whose parent was accepted; outcome: accepted (T = 0, teacher-forced)",
        **{name: split_report(*split, depth, scale, shift) for name, split in splits.items()},
        "source": str(folder),
        "tree": f"chain:{depth}",
        "request": asdict(req),
        "command": req.command,
    }
    write_calibrated(folder, Path(req.out).expanduser(), scale, shift, record, req.plots)
    return record


def split_report(predicted, outcome, depths, prompts: int, depth: int, scale: float, shift: float) -> dict:
    """One split's slots, AUROC and, before and after the map, the ECE, reliability and per-position means."""
    from draftsmith.runtime.verify.calibration import CalibrationSums
    from draftsmith.runtime.verify.recalibration import auroc, platt

    def summary(p) -> dict:
        sums = CalibrationSums.of(p, outcome, depths - 1, depth)
        return {k: v for k, v in sums.summary().items() if k in FIELDS}

    return {
        "prompts": prompts,
        "slots": len(predicted),
        "auroc": None if (a := auroc(predicted, outcome)) is None else round(a, 4),
        "before": summary(predicted),
        "after": summary(platt(predicted, scale, shift)),
    }


def write_calibrated(folder: Path, out: Path, scale: float, shift: float, record: dict, plots: bool) -> None:
    """Copy the head, rewrite its confidence tensors, add calibration.json and the plot; rename into place."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from draftsmith.runtime.core.artifacts import atomic_save_file
    from draftsmith.runtime.heads.dspark import platt_folded

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        shutil.copytree(folder, staging, dirs_exist_ok=True)
        weights = staging / "model.safetensors"
        with safe_open(str(weights), "pt") as f:
            metadata = f.metadata()
        atomic_save_file(weights, platt_folded(load_file(str(weights)), scale, shift), metadata or {})
        (staging / "calibration.json").write_text(json.dumps(record, indent=1) + "\n")
        if plots:
            plot(staging / "reliability.png", record)
        old = out.with_name(f".{out.name}.old") if out.exists() else None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        staging.rename(out)
        if old is not None:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def plot(path: Path, record: dict) -> None:
    from draftsmith.train.loop.metrics import reliability_plot

    series = [
        (f"{split} {when}: ECE {got['calibration_error']:.3f}", got["reliability"])
        for split in ("fit", "validation")
        for when, got in record[split].items()
        if when in ("before", "after")
    ]  # fmt: skip
    reliability_plot(path, series, title="confidence head before and after Platt scaling (T = 0)")
