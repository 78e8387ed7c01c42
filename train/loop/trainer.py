"""The training loop on Accelerate: one code path for one CPU, DDP (gloo or NCCL) and DeepSpeed ZeRO-2/3.

    draftsmith train --config configs/eagle3-smollm2-135m.yaml train.max_steps=20 output_dir=runs/smoke
    accelerate launch --config_file configs/accelerate/ddp-cpu.yaml -m draftsmith.train --config ...

A run: load the target (frozen, or made trainable for co-training: MTP, Medusa-2, EAGLE-3; offline only its
embedding, final norm and LM head, `runtime/core/target_parts.py`), run the data steps it needs
(cached), build the head and its objective (`objective(head.type)`, train/objectives/registry.py), then
AdamW with linear warmup and cosine decay, gradient accumulation and clipping. Every `log.every` steps a
row goes to metrics.jsonl (and the tracker), every `eval.every` steps the validation split is scored (loss,
accuracy per TTT step or MTP module, simulated tau; for a co-trained target its drift), every
`checkpoint.every` steps a checkpoint is written (atomic, rotated). A non-finite loss or gradient norm
stops the run on every rank with the step and row ids, before anything is saved.
The end: `output_dir/final/` (a head `--draft eagle3:DIR` / `mtp:DIR` loads; a co-trained target in
`final/target/`), the PNG curve, and for a kind with a confidence head (DSpark) the evaluation rows'
calibration (ECE, predicted vs realized acceptance per position) and its last reliability plot.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.runtime.core.config import save_config
from draftsmith.runtime.errors import BadInputError, DraftsmithError, renamed_fields
from draftsmith.runtime.heads.trained_for import stamp, trained_for
from draftsmith.train.loop.accelerator_setup import no_zero3_init
from draftsmith.train.loop.checkpoints import (
    cfg_fingerprint,
    check_resume,
    newest_intact,
    read_state,
    save_checkpoint,
)
from draftsmith.train.loop.data_steps import TrainRows, ensure_data
from draftsmith.train.loop.loader import micro_batches
from draftsmith.train.loop.metrics import (
    MetricsWriter,
    plot_curves,
    plot_reliability,
    tracker_kwargs,
    tracker_setup,
)
from draftsmith.train.loop.trainer_setup import (  # noqa: F401 (lr_lambda: re-exported for the tests)
    check_memory,
    head_inputs,
    lr_lambda,
    prepare_training,
    sample_order,
    start_accelerator,
)
from draftsmith.train.objectives.eagle3_objective import simulated_tau
from draftsmith.train.objectives.registry import objective

log = logging.getLogger("draftsmith")


class NonFiniteError(DraftsmithError):
    """A non-finite loss or gradient: the run stops and nothing is saved (exit code 1)."""


def all_finite(accelerator, value: torch.Tensor) -> bool:
    flag = torch.isfinite(value.detach()).all().float().reshape(1).to(accelerator.device)
    return bool(accelerator.gather(flag).min() > 0)


def load_target(cfg, acc, whole: bool = False):
    """The frozen target: offline (data.mode), only the parts the batches read (runtime/core/target_parts.py),
    unless `whole`; online, every layer (target_placement=tp: this rank's tensor-parallel shard of each,
    runtime/core/placement.py). Errors name the config key `target`."""
    from draftsmith.runtime.core.chat_template import thinking_arg, use_thinking
    from draftsmith.runtime.core.placement import resident_bytes
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.core.target_parts import TargetParts

    with no_zero3_init(acc), renamed_fields({"--target": "target"}):
        if cfg.data.mode == "offline" and not whole:
            parts = TargetParts.load(cfg.target, device=str(acc.device), dtype=cfg.dtype)
            log.info("offline: %s", parts.description())
            use_thinking(parts, thinking_arg(cfg.data.thinking, "data.thinking"), "data.thinking")
            return parts
        layout = target_layout(cfg, acc)
        target = Target.load(cfg.target, device=str(acc.device), dtype=cfg.dtype, layout=layout)
    # the data steps render with it and record it; final/ carries it (runtime/core/chat_template.py)
    use_thinking(target, thinking_arg(cfg.data.thinking, "data.thinking"), "data.thinking")
    if target.tp_size > 1:
        log.info(
            "target: %s over %d ranks x %d data-parallel group(s), %.1f MB of weights per rank",
            "expert parallel" if layout.experts and not layout.dense else "tensor parallel",
            layout.tp,
            layout.dp,
            resident_bytes(target.model) / 2**20,
        )
    return target


def target_layout(cfg, acc):
    """This rank's place on the (dp, tp) mesh of `target_placement` (runtime/core/placement.py), checked
    against the target's config before anything loads (exit 2 naming target_placement or tp_size)."""
    from draftsmith.runtime.core.placement import Layout, check_placement

    world, rank = acc.num_processes, acc.process_index
    if cfg.target_placement == "replicate":
        return Layout(1, world, rank)
    from transformers import AutoConfig

    from draftsmith.runtime.core.targets import resolve_target

    with renamed_fields({"--target": "target"}):
        config = AutoConfig.from_pretrained(resolve_target(cfg.target).path)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return check_placement(config, cfg.target_placement, cfg.tp_size, world, rank, local, cfg.ep_size)


class Trainer:
    def __init__(self, cfg):
        self.cfg, self.out = cfg, Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        log_with = tracker_setup(cfg.log.tracker, self.out)
        self.acc, self.precision = start_accelerator(cfg, log_with)  # train/loop/trainer_setup.py
        self.layout = target_layout(
            cfg, self.acc
        )  # tp: ranks of a group share rows; the head is DP over them
        check_memory(cfg, self.acc)  # bytes per rank from the target's config, before anything loads
        # replicate: every rank holds the whole frozen target (offline: all its parts); tp: its shard
        self.target = load_target(cfg, self.acc)
        self.target.model.requires_grad_(False)
        self.aux = head_inputs(cfg, self.target)
        self.paths = self.data_steps()  # rank 0 first; offline capture in one part per rank (data_steps)
        self.train_rows = TrainRows(self.paths, "train", dtype=self.target.dtype)
        self.val_rows = TrainRows(self.paths, "validation", dtype=self.target.dtype)
        self.order = sample_order(cfg, self.train_rows, self.layout)
        self.kind = objective(cfg.head.type)(cfg, self.target, self.aux, self.paths)
        self.head = self.kind.head
        self.model, self.optimizer, self.scheduler = prepare_training(
            cfg, self.acc, self.kind.model, self.target
        )
        self.original_val_loss = None  # co-training: the target's validation loss before any update
        self.step = self.resume()
        self.start_records(log_with)

    def start_records(self, log_with) -> None:
        """What a run writes before its first step: a co-trained target's original validation loss (once,
        kept across resumes), config.yaml, the metrics writer and the trackers."""
        cfg, acc = self.cfg, self.acc
        if cfg.cotrain.enabled and self.original_val_loss is None:
            self.original_val_loss = self.target_drift()["target_val_loss"]
            log.info("co-training: the original target's validation loss is %.4f", self.original_val_loss)
        if acc.is_main_process:
            save_config(cfg, self.out / "config.yaml")
            self.metrics = MetricsWriter(self.out, self.step)
        if log_with:
            acc.init_trackers(
                cfg.log.project, config=_flat(asdict(cfg)), init_kwargs=tracker_kwargs(log_with, self.out)
            )

    def data_steps(self):
        """ensure_data; offline with a capture still to make (data_steps raises PartsOnlyError on every
        rank alike), the whole target is loaded for the capture alone and dropped after it, once the
        preflight has estimated that phase (train/preflight/capture.py: exit 2 when it does not fit)."""
        from draftsmith.runtime.core.target_parts import PartsOnlyError

        cfg, acc = self.cfg, self.acc
        try:
            return ensure_data(cfg, self.target, self.aux, progress=acc.is_main_process, acc=acc)
        except PartsOnlyError:  # capture runs every layer; training then reads its shards and the parts
            if cfg.train.preflight != "off":  # its bytes per rank, before the whole target loads
                from draftsmith.train.preflight.capture import check_capture

                with no_zero3_init(acc):  # its meta-device models must not go through ZeRO-3's zero.Init
                    check_capture(cfg, acc, self.target, self.aux)
            log.info("offline: the capture needs the whole target: loading it for the capture only")
            whole = load_target(cfg, acc, whole=True)
            paths = ensure_data(cfg, whole, self.aux, progress=acc.is_main_process, acc=acc)
            del whole
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return paths

    # ---- resume ---------------------------------------------------------------------------------------
    def resume(self) -> int:
        found = newest_intact(self.out) if self.cfg.checkpoint.resume == "auto" else None
        if found is None:
            return 0
        state = read_state(found)
        check_resume(state, self.acc.num_processes, self.paths.data_hash, self.cfg)
        if state.get("tp_size", 1) != self.layout.tp and not self.cfg.train.allow_world_size_change:
            raise BadInputError(
                "resume",
                f"a checkpoint written with tp_size {state.get('tp_size', 1)}",
                f"tp_size {self.layout.tp} (or train.allow_world_size_change=true: the data order changes)",
            )
        self.acc.load_state(str(found))
        self.original_val_loss = state.get("original_target_val_loss")
        log.info("resumed from %s (step %d)", found, state["step"])
        return state["step"]

    def state(self) -> dict:
        return {
            "step": self.step,
            "world_size": self.acc.num_processes,
            "tp_size": self.layout.tp,
            "data_hash": self.paths.data_hash,
            "config_hash": cfg_fingerprint(self.cfg),
            "lr": self.scheduler.get_last_lr()[0],
            "original_target_val_loss": self.original_val_loss,
        }

    # ---- one optimizer step ----------------------------------------------------------------------------
    def micro_batches(self):
        """The rows of the coming micro-batches, read ahead (train/loop/loader.py); opened at the first step
        after a start or resume."""
        if getattr(self, "_micro_batches", None) is None:
            t = self.cfg.train
            self._micro_batches = micro_batches(
                self.train_rows, self.order, self.step, t.max_steps, t.grad_accum, t.loader_workers,
                t.loader_prefetch,
            )  # fmt: skip
        return self._micro_batches

    def train_step(self) -> dict:
        acc, cfg = self.acc, self.cfg
        totals = {"loss": 0.0, "correct": 0, "counted": 0, "tokens": 0}
        self.begin_step()
        for micro in range(cfg.train.grad_accum):
            step, at, rows_at, rows = next(self.micro_batches())
            assert (step, at) == (self.step, micro), "the loader left the sample order"
            inputs = self.kind.batch(rows, acc.device)
            with acc.accumulate(self.model):
                loss, correct, counted = self.model(**inputs)
                if not all_finite(acc, loss):
                    ids = [self.train_rows.row_id(k) for k in rows_at]
                    raise NonFiniteError(
                        f"non-finite loss at step {self.step + 1}, micro-batch {micro}, rank "
                        f"{acc.process_index}, rows {ids}: stopped, no checkpoint written"
                    )
                acc.backward(loss)
                norm = None
                if acc.sync_gradients:
                    norm = acc.clip_grad_norm_(self.model.parameters(), cfg.train.max_grad_norm)
                    if norm is not None and not all_finite(acc, torch.as_tensor(norm)):
                        raise NonFiniteError(
                            f"non-finite gradient norm at step {self.step + 1}: stopped, "
                            "no checkpoint written"
                        )
                self.optimizer.step()  # a no-op inside an accumulation window
                if acc.sync_gradients:
                    self.scheduler.step()
                self.optimizer.zero_grad()
            totals["loss"] += float(loss.detach()) / cfg.train.grad_accum
            totals["correct"] = correct + totals["correct"]
            totals["counted"] = counted + totals["counted"]
            totals["tokens"] += int(inputs["valid"].sum())
        totals["grad_norm"] = float(norm) if norm is not None else float("nan")
        self.step += 1
        return totals

    def begin_step(self) -> None:
        """What the objective sets before step `self.step` (Medusa-2's lambda0), a function of the step only
        so a resumed run sets the same."""
        begin = getattr(self.kind, "begin_step", None)
        if begin is not None:
            begin(self.step)

    # ---- evaluation -------------------------------------------------------------------------------------
    def val_batches(self):
        """This process's share of the first `eval.max_rows` validation rows, as model inputs."""
        acc, cfg = self.acc, self.cfg
        n = min(cfg.eval.max_rows, len(self.val_rows))
        mine = list(range(self.layout.dp_rank, n, self.layout.dp))  # a TP group scores its share together
        for i in range(0, len(mine), cfg.train.batch_size):
            yield self.kind.batch([self.val_rows[k] for k in mine[i : i + cfg.train.batch_size]], acc.device)

    @torch.no_grad()
    def evaluate(self) -> dict:
        acc, cfg = self.acc, self.cfg
        steps = self.kind.depth
        sums = torch.zeros(2 + 2 * steps, device=acc.device)  # loss*rows, rows, correct[K], counted[K]
        self.begin_step()
        eval_begin, eval_fields = (getattr(self.kind, k, None) for k in ("eval_begin", "eval_fields"))
        if eval_begin is not None:  # a kind's own evaluation sums (DSpark: its confidence head's calibration)
            eval_begin()
        self.model.eval()
        for inputs in self.val_batches():
            rows = inputs["input_ids"].shape[0]
            loss, correct, counted = self.model(**inputs)
            sums += torch.cat([torch.stack([loss * rows, loss.new_tensor(rows)]), correct, counted])
        self.model.train()
        sums = acc.reduce(sums, reduction="sum")
        correct, counted = sums[2 : 2 + steps], sums[2 + steps :]
        accuracy = (correct / counted.clamp(min=1)).tolist()
        row = {
            "kind": "eval",
            "step": self.step,
            "loss": float(sums[0] / sums[1].clamp(min=1)),
            "accuracy_per_step": [round(a, 4) for a in accuracy],
            "simulated_tau": round(simulated_tau(accuracy), 4),
            "rows": int(sums[1]) // self.layout.tp,  # each TP group's ranks all scored its rows
        }
        if eval_fields is not None:
            row.update(eval_fields(lambda t: acc.reduce(t.to(acc.device), reduction="sum") / self.layout.tp))
        if cfg.cotrain.enabled:  # the drift report: is the co-trained target still as good?
            row.update(self.target_drift())
            row["original_target_val_loss"] = round(self.original_val_loss, 5)
            row["target_val_loss_drift"] = round(row["target_val_loss"] - row["original_target_val_loss"], 5)
        return row

    @torch.no_grad()
    def target_drift(self) -> dict:
        """The co-trained target on the validation rows (each process scores its share): its next-token
        loss and, with LoRA (or a frozen copy of the original, Medusa-2's `original`), its mean KL from the
        original and how often their argmaxes agree."""
        from draftsmith.train.objectives.cotrain import drift_sums

        original = getattr(self.kind, "original", self.kind.peft_model)
        sums = drift_sums(self.target, original, list(self.val_batches()))
        sums = self.acc.reduce(sums.to(self.acc.device, torch.float32), reduction="sum")
        n = float(sums[1].clamp(min=1))
        row = {"target_val_loss": round(float(sums[0]) / n, 5)}
        if original is not None:
            row["target_kl_to_original"] = round(float(sums[2]) / n, 6)
            row["target_argmax_agreement"] = round(float(sums[3]) / n, 5)
        return row

    # ---- the run ---------------------------------------------------------------------------------------
    def log_row(self, row: dict) -> None:
        if self.acc.is_main_process:
            self.metrics.write(row)
        if self.cfg.log.tracker != "none":
            flat = {f"{row['kind']}/{k}": v for k, v in row.items() if isinstance(v, (int, float))}
            for k, a in enumerate(row.get("accuracy_per_step", [])):
                flat[f"{row['kind']}/accuracy_step{k}"] = a
            self.acc.log(flat, step=self.step)

    def save(self) -> None:
        save_checkpoint(self.acc, self.out, self.state(), self.cfg.checkpoint.keep)

    def fit(self) -> dict:
        from tqdm.auto import tqdm

        cfg, acc = self.cfg, self.acc
        bar = tqdm(
            total=cfg.train.max_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not (cfg.log.progress and acc.is_main_process),
        )
        window = {"tokens": 0, "start": time.perf_counter()}
        last_eval = None
        while self.step < cfg.train.max_steps:
            totals = self.train_step()
            window["tokens"] += totals["tokens"]
            bar.update(1)
            if self.step % cfg.log.every == 0 or self.step == cfg.train.max_steps:
                row = self.train_row(totals, window)
                bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=row["accuracy_per_step"][0], refresh=False)
                self.log_row(row)
            if (cfg.eval.every and self.step % cfg.eval.every == 0) or self.step == cfg.train.max_steps:
                last_eval = self.evaluate()
                self.log_row(last_eval)
                log.info(
                    "eval step %d: loss %.4f, simulated tau %.3f, accuracy per step %s",
                    self.step,
                    last_eval["loss"],
                    last_eval["simulated_tau"],
                    last_eval["accuracy_per_step"],
                )
            if (cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0) or (
                self.step == cfg.train.max_steps
            ):
                self.save()
        bar.close()
        if last_eval is None:  # a finished run rerun (resumed at max_steps): score the head it holds
            last_eval = self.evaluate()
        self.finish()
        return last_eval

    def train_row(self, totals: dict, window: dict) -> dict:
        counted = self.acc.reduce(totals["counted"].detach().clone(), reduction="sum")
        correct = self.acc.reduce(totals["correct"].detach().clone(), reduction="sum")
        tokens = self.acc.reduce(torch.tensor(float(window["tokens"]), device=self.acc.device), "sum")
        tokens = tokens / self.layout.tp  # the ranks of a TP group trained on the same tokens
        elapsed = time.perf_counter() - window["start"]
        window.update(tokens=0, start=time.perf_counter())
        accuracy = (correct / counted.clamp(min=1)).tolist()
        lrs = self.scheduler.get_last_lr()  # the head's, then (cotrain.target_lr_ratio != 1) the target's
        row = {
            "kind": "train",
            "step": self.step,
            "loss": totals["loss"],  # unrounded: resume tests compare it bitwise
            "accuracy_per_step": [round(a, 4) for a in accuracy],
            "simulated_tau": round(simulated_tau(accuracy), 4),
            "lr": lrs[0],
            "grad_norm": round(totals["grad_norm"], 5),
            "tokens_per_s": round(float(tokens) / elapsed, 1),
            "epoch": round(self.order.epoch(self.step - 1), 4),
        }
        if len(lrs) > 1:
            row["target_lr"] = lrs[1]
        fields = getattr(self.kind, "log_fields", None)  # e.g. Medusa-2's lambda0 of the step
        return {**row, **(fields() if fields is not None else {})}

    def finish(self) -> None:
        acc = self.acc
        acc.wait_for_everyone()
        state = acc.get_state_dict(self.model)  # gathers ZeRO-3 shards on the main process
        if acc.is_main_process:
            final = self.out / "final"
            self.kind.save_final(state, final)
            stamp(final, trained_for(self.paths.fingerprint))  # the data's template and thinking mode
            plot_curves(self.metrics.path, self.out / "training_curve.png")
            plot_reliability(self.metrics.path, self.out / "reliability.png")  # a kind with a confidence head
            use = f"--draft {self.cfg.head.type}:{final}"
            if self.cfg.cotrain.enabled:  # the modules only serve with the target they co-trained
                use = f"--target {final / 'target'} {use}"
            log.info("final head: %s (use it with %s)", final, use)
        acc.end_training()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return out


def train(cfg) -> dict:
    """Run a training job to the end; returns the last evaluation row."""
    return Trainer(cfg).fit()
