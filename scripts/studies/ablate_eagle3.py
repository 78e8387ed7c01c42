"""Issue 25 item 5: each EAGLE-3 training lever for the same wall-clock budget, one table.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/studies/ablate_eagle3.py --minutes-per-run 20 \\
        --out runs/ablate-eagle3
    .venv/bin/python scripts/studies/ablate_eagle3.py --minutes-per-run 20 --levers baseline,loss-tv \\
        --self-distilled data/sharegpt-regen.jsonl          # + the self-distilled lever

Levers (train/objectives/eagle3_levers.py), each the recipe (`--config`, default
configs/eagle3-smollm2-135m.yaml) with a few overrides, every run with the same `--set` overrides on top:

    baseline          the recipe as shipped (forward KL, 7 TTT steps weighted 0.8**k)
    loss-rkl|jsd|tv|lk_hybrid   head.loss=...
    ttt-schedule      head.ttt_schedule=3,7@0.3 (3 TTT steps for the first 30% of the steps, then 7)
    noise             train.noise_std=0.05 (speculators' default)
    self-distilled    data.source=FILE (`--self-distilled FILE`: conversations whose answers are the
                      target's own, e.g. `draftsmith data regenerate`'s rows written as JSONL)

Same wall clock, not the same steps: a lever that makes a step cheaper (the schedule) trains more of
them. Each run first times `--probe-steps` optimizer steps of its own config after one warm-up step (the
median; per TTT stage for a schedule, weighted by the stage's share of the run) and sets train.max_steps =
budget / seconds per step, so the LR schedule and the TTT schedule span the run; the target's loading,
the data steps and the final evaluation are outside the budget. Each run evaluates once at its end on the
recipe's validation rows (eval.max_rows): the loss, accuracy per TTT step (argmax agreement with the
target, train/objectives/eagle3_objective.py) and simulated tau = 1 + sum_k prod_{j<=k} acc_j.

Resumable: OUT/<lever>/plan.json fixes a run's steps once timed; a killed run resumes from its last
checkpoint (the trainer's checkpoint.resume=auto); a finished run (OUT/<lever>/result.json) is skipped.
OUT/ablation.md and OUT/ablation.json are rewritten after every run. Caveat: the self-distilled run
validates on its own (regenerated) rows, where the target is more predictable; compare heads across data
with `draftsmith bench` on held-out prompts. The timing is only as fair as the machine is quiet: run it
alone on the CPU (other processes slow some probes and not others).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import shutil
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEVERS = {
    "baseline": [],
    "loss-rkl": ["head.loss=rkl"],
    "loss-jsd": ["head.loss=jsd"],
    "loss-tv": ["head.loss=tv"],
    "loss-lk_hybrid": ["head.loss=lk_hybrid"],
    "ttt-schedule": ["head.ttt_schedule=3,7@0.3"],
    "noise": ["train.noise_std=0.05"],
}
log = logging.getLogger("draftsmith")


# ---- timing -------------------------------------------------------------------------------------------
def seconds_per_step(config: Path | None, overrides: list[str], probe_dir: Path, probe_steps: int) -> float:
    """The lever's training seconds per optimizer step: one warm-up step, then `probe_steps` timed, per
    TTT stage of its schedule (each as a plain run with that many steps), weighted by the stage's share."""
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.trainer import Trainer
    from draftsmith.train.objectives.eagle3_levers import parse_ttt_schedule

    cfg = load_train_config(config, overrides)
    eagle3 = cfg.head.type == "eagle3"  # another kind (--config of a P-EAGLE or DFlash recipe): one stage
    schedule = parse_ttt_schedule(cfg.head.ttt_schedule, cfg.train.ttt_steps) if eagle3 else None
    stages = schedule or ((0.0, cfg.train.ttt_steps),)
    starts = [f for f, _ in stages] + [1.0]
    total = 0.0
    for (start, k), end in zip(stages, starts[1:]):
        shutil.rmtree(probe_dir, ignore_errors=True)
        probe = [*overrides, f"output_dir={probe_dir}", f"train.max_steps={probe_steps + 1}"]
        if eagle3:
            probe += [f"train.ttt_steps={k}", "head.ttt_schedule=", "head.ttt_weights=null"]
        probe += ["checkpoint.every=0", "eval.every=0", "train.preflight=off"]
        trainer = Trainer(load_train_config(config, probe))
        trainer.train_step()  # warm-up: first-call allocations and kernel choices
        times = []
        for _ in range(probe_steps):
            began = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - began)
        per_step = statistics.median(times)  # a step slowed by another process's burst does not count
        log.info("ablate: %d TTT steps: %.2f s per step", k, per_step)
        total += (end - start) * per_step
        del trainer
        gc.collect()
    shutil.rmtree(probe_dir, ignore_errors=True)
    return total


# ---- one run ------------------------------------------------------------------------------------------
def run_lever(name: str, lever: list[str], args) -> dict:
    """Time, train and evaluate one lever (its overrides `lever` on top of `--set`), or read its result."""
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.trainer import train

    overrides = [*args.set, *lever]

    folder = args.out / name
    done = folder / "result.json"
    if done.exists():
        log.info("ablate: %s finished before: skipped", name)
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    plan_file = folder / "plan.json"
    if plan_file.exists():  # a resumed run keeps its steps (and so its LR and TTT schedules)
        plan = json.loads(plan_file.read_text())
    else:
        per_step = seconds_per_step(args.config, overrides, folder / "probe", args.probe_steps)
        steps = max(1, math.floor(args.minutes_per_run * 60 / per_step))
        plan = {"lever": name, "overrides": lever, "seconds_per_step": round(per_step, 4), "max_steps": steps}
        plan_file.write_text(json.dumps(plan, indent=1) + "\n")
    steps = plan["max_steps"]
    run = [*overrides, f"output_dir={folder / 'run'}", f"train.max_steps={steps}", "eval.every=0"]
    run += [f"checkpoint.every={max(1, steps // 5)}"]  # a killed run loses at most a fifth
    log.info("ablate: %s: %d steps (%.2f s each) with %s", name, steps, plan["seconds_per_step"], overrides)
    began = time.perf_counter()
    last = train(load_train_config(args.config, run))
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in rows if r["kind"] == "train" and r.get("tokens_per_s")]
    result = {
        **plan,
        "wall_seconds": round(time.perf_counter() - began, 1),  # this invocation's (a resume: its part)
        "train_tokens_per_s": round(sum(speeds) / len(speeds), 1) if speeds else None,
        "val_loss": last["loss"],
        "accuracy_per_step": last["accuracy_per_step"],
        "simulated_tau": last["simulated_tau"],
        "val_rows": last["rows"],
        "head": str(folder / "run" / "final"),
    }
    done.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---- the table ----------------------------------------------------------------------------------------
def table(results: list[dict], minutes: float) -> str:
    base = next((r for r in results if r["lever"] == "baseline"), None)
    depth = max(len(r["accuracy_per_step"]) for r in results)
    head = ["lever", "overrides", "steps", "s/step", "tok/s"]
    head += [f"acc{k}" for k in range(depth)] + ["sim. tau", "vs baseline", "val loss"]
    lines = [
        f"EAGLE-3 levers, {minutes:g} training minutes each (scripts/studies/ablate_eagle3.py); validation "
        "accuracy per TTT step and simulated tau at the end of each run.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    best = max(results, key=lambda r: r["simulated_tau"])
    for r in results:
        delta = f"{r['simulated_tau'] - base['simulated_tau']:+.3f}" if base else ""
        accs = [f"{a:.3f}" for a in r["accuracy_per_step"]] + [""] * (depth - len(r["accuracy_per_step"]))
        name = f"**{r['lever']}**" if r is best else r["lever"]
        cells = [name, " ".join(r["overrides"]) or "-", str(r["max_steps"]), f"{r['seconds_per_step']:.2f}"]
        cells += [str(r["train_tokens_per_s"]), *accs, f"{r['simulated_tau']:.3f}", delta]
        cells += [f"{r['val_loss']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Best simulated tau: {best['lever']}. Loss values are not comparable across head.loss"]
    lines[-1] += " settings (each is its own divergence; kl is logged as soft cross-entropy)."
    if any(r["lever"] == "self-distilled" for r in results):
        lines += ["self-distilled validates on its own regenerated rows: bench it on held-out prompts."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes-per-run", type=float, required=True, help="training minutes per lever")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "eagle3-smollm2-135m.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/ablate-eagle3"))
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"a subset of {', '.join(LEVERS)}")
    parser.add_argument("--self-distilled", default=None, help="a conversations file of the target's answers")
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every run")
    parser.add_argument("--probe-steps", type=int, default=3, help="timed steps per TTT stage")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    levers = {k: LEVERS[k] for k in args.levers.split(",") if k}
    unknown = sorted(set(args.levers.split(",")) - set(LEVERS) - {""})
    if unknown or args.minutes_per_run <= 0 or args.probe_steps < 1:
        parser.error(f"unknown levers {unknown}" if unknown else "--minutes-per-run and --probe-steps > 0")
    if args.self_distilled:
        if not Path(args.self_distilled).exists():
            parser.error(f"--self-distilled {args.self_distilled}: no such file")
        levers["self-distilled"] = [f"data.source={args.self_distilled}"]
    results = []
    for name, overrides in levers.items():
        results.append(run_lever(name, overrides, args))
        (args.out / "ablation.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "ablation.md").write_text(table(results, args.minutes_per_run))
    print((args.out / "ablation.md").read_text())


if __name__ == "__main__":
    main()
