"""Where training numbers go: `output_dir/metrics.jsonl`, the experiment tracker, a PNG curve and, for a
confidence head, a reliability plot.

    writer = MetricsWriter(output_dir, resume_step)       # main process only
    writer.write({"step": 10, "loss": 2.1, ...})
    plot_curves(output_dir / "metrics.jsonl", output_dir / "training_curve.png")
    plot_reliability(output_dir / "metrics.jsonl", output_dir / "reliability.png")  # confidence heads
    reliability_plot(path, [(label, bins)])     # bins: runtime/verify/calibration.py's summary (bench too)

metrics.jsonl has one JSON object per logged step (`kind` = "train" or "eval"). A resumed run first drops
rows past its checkpoint's step, so the file reads as one uninterrupted run. Trackers: `wandb` (offline
unless WANDB_API_KEY is set or WANDB_MODE says otherwise; files under output_dir/wandb), `tensorboard`
(output_dir/tensorboard) or `none`; they go through Accelerate's tracker API.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")
METRICS_FILE = "metrics.jsonl"


def tracker_setup(tracker: str, output_dir: Path) -> str | None:
    """-> the Accelerate `log_with` value; makes wandb offline when there is no API key."""
    if tracker == "none":
        return None
    module = {"wandb": "wandb", "tensorboard": "tensorboard"}[tracker]
    if importlib.util.find_spec(module) is None:
        raise BadInputError(
            "log.tracker", tracker, f"an installed tracker: pip install 'draftsmith[train]' (or {module})"
        )
    if tracker == "wandb":
        if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
            os.environ["WANDB_MODE"] = "offline"
            log.info("wandb: no WANDB_API_KEY, logging offline (wandb sync %s/wandb/... later)", output_dir)
    return tracker


def tracker_kwargs(tracker: str, output_dir: Path) -> dict:
    """Per-run tracker settings: wandb writes under this run's folder (an environment variable would
    outlive the run and send a second run in the same process, the demo's or a test's, to the first's)."""
    return {"wandb": {"dir": str(output_dir)}} if tracker == "wandb" else {}


class MetricsWriter:
    def __init__(self, output_dir: Path, resume_step: int = 0):
        self.path = Path(output_dir) / METRICS_FILE
        if self.path.is_file():  # keep rows up to the resumed step: the file reads as one run
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resume_step
            ]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curves(metrics: Path, out: Path) -> Path | None:
    """Loss (train and eval), simulated tau (eval) and, for a co-trained target, its validation loss next
    to the original's, vs step, as one PNG; None without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        log.info("no matplotlib: skipping %s (pip install 'draftsmith[train]')", out)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    drift = [r for r in evals if "target_val_loss" in r]
    fig, axes = plt.subplots(1, 3 if drift else 2, figsize=(15 if drift else 10, 3.6))
    ax_loss, ax_tau = axes[0], axes[1]
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="validation")
        ax_tau.plot([r["step"] for r in evals], [r["simulated_tau"] for r in evals], "o-", color="C2")
    ax_loss.set(xlabel="step", ylabel="loss (weighted sum over steps)", title="loss")
    ax_loss.legend()
    ax_tau.set(xlabel="step", ylabel="tokens per target forward", title="simulated tau (validation)")
    if drift:
        ax_drift = axes[2]
        steps = [r["step"] for r in drift]
        ax_drift.plot(steps, [r["target_val_loss"] for r in drift], "o-", label="co-trained target")
        ax_drift.plot(steps, [r["original_target_val_loss"] for r in drift], "--", label="original target")
        title = "target drift"
        if "target_kl_to_original" in drift[-1]:
            kl, agree = drift[-1]["target_kl_to_original"], drift[-1]["target_argmax_agreement"]
            title += f" (KL {kl:.3f}, argmax agreement {agree:.2f})"
        ax_drift.set(xlabel="step", ylabel="next-token CE (validation)", title=title)
        ax_drift.legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def plot_reliability(metrics: Path, out: Path) -> str | None:
    """The last evaluation's reliability of a confidence head (rows with `reliability`: DSpark), drawn as
    `bench` draws a draft's; None when no evaluation row has one."""
    evals = [r for r in read_metrics(metrics) if r.get("kind") == "eval" and r.get("reliability")]
    if not evals:
        return None
    last = evals[-1]
    label = f"validation, step {last['step']}: ECE {last['calibration_error']:.3f}"
    return reliability_plot(out, [(label, last["reliability"])], "confidence head vs realized acceptance")


def reliability_plot(path: Path, series: list[tuple[str, list[dict]]], title: str = "") -> str | None:
    """A confidence head's (or any survival estimate's, `bench`'s too) reliability: observed frequency vs
    mean prediction per bin, one line per (label, reliability bins: runtime/verify/calibration.py's
    summary), the diagonal (perfect calibration) dashed, each point's count written beside it, the counts
    as bars below. None without matplotlib or without a counted bin."""
    series = [(label, [b for b in bins if b["count"]]) for label, bins in series]
    series = [(label, bins) for label, bins in series if bins]
    if not series:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        log.info("no matplotlib: skipping %s (pip install 'draftsmith[train]')", path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, counts) = plt.subplots(2, 1, figsize=(6, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
    width = 0.8 / len(series) * (series[0][1][0]["bin"][1] - series[0][1][0]["bin"][0])
    for i, (label, bins) in enumerate(series):
        xs, ys = [b["predicted"] for b in bins], [b["observed"] for b in bins]
        ax.plot(xs, ys, marker="o", label=label)
        for b in bins:
            ax.annotate(str(b["count"]), (b["predicted"], b["observed"]), fontsize=6,
                        textcoords="offset points", xytext=(3, 3))  # fmt: skip
        centers = [(b["bin"][0] + b["bin"][1]) / 2 + (i - (len(series) - 1) / 2) * width for b in bins]
        counts.bar(centers, [b["count"] for b in bins], width, label=label)
    ax.set(ylabel="observed acceptance frequency", xlim=(0, 1), ylim=(0, 1),
           title=title or "reliability of the survival estimates")  # fmt: skip
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    counts.set(xlabel="predicted acceptance (bin mean; bars: bin ranges)", ylabel="nodes")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return str(path)
