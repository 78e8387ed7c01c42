"""draftsmith's EAGLE-3 trainer next to the `speculators` (0.9.0) package's own Trainer: the same prepared
rows in the same order, the same head shape and initial weights, the same number of optimizer steps;
training tokens/s and validation accuracy per TTT step, both heads scored by ONE function.

    python scripts/studies/speculators_trainer_compare.py --out runs/spec-compare --steps 100        # SmolLM2
    python scripts/studies/speculators_trainer_compare.py --smoke --out /tmp/spec-smoke              # seconds

The measurement (one process, ours first, then theirs):
1. `draftsmith.train.loop.trainer.Trainer(cfg)` runs the data steps (prepare, draft vocab), loads the frozen
   target and builds the initial head (init_from_target: lm_head rows and final norm are the target's).
2. Ours: `Trainer.train_step()` `--steps` times. Every micro-batch's rows are recorded and the time spent
   building it (`kind.batch`: the online target forward) is subtracted from the step's wall time.
3. Theirs: the same initial head goes through our `to_speculators` export into speculators'
   `Eagle3DraftModel` (its `from_pretrained`, as tests/runtime/test_speculators_interop.py loads it), and
   speculators' own `Trainer.train_epoch` runs on a loader that yields, per step, the rows ours trained on,
   as their data pipeline packs them: raw samples (`hidden_states`, `input_ids`,
   `verifier_last_hidden_states`, `loss_mask`, `position_ids`) through their `shift_batch` and `CollateFn`.
   The model time is their own step profile (`fwd_ms + bwd_ms + opt_ms` from the `speculators.metrics`
   log, which excludes the fetch, i.e. our target forward).
4. Both heads are scored by `draftsmith`'s `Trainer.evaluate()` on the same validation rows: theirs is
   converted back by its `save_pretrained` + our `load_eagle3` and loaded into the trainer's head. Both
   trained heads are kept in our layout: OUT/heads/draftsmith, OUT/heads/speculators (`--draft eagle3:`).
   `roundtrip_check` proves the conversion is lossless on a known head (equal evaluation both ways) and
   `logits_check` that their forward on the packed batch gives our TTT logits at every counted position.
tokens/s = the rows' real tokens (the same count for both) / the model seconds, over the steps after the
first `--warmup` (left out of both). `trainable_params` says what each optimizer updates.

What is matched: rows and order, batch (their packed sequence = the step's rows back to back, no padding:
`total_seq_len` = the rows' shifted lengths), max length, aux layers, draft vocabulary (d2t / t2d), head
shape and initial weights, TTT steps, step decay (their `exp_loss_decay` = decay**k), the per-step loss
(their masked-mean KL = our soft CE minus the target's entropy: same gradients), the supervised positions
(their mask at p := our "token p+1 supervised and the target's argmax at p in the draft vocabulary", so
both count exactly the same positions), AdamW lr / weight decay, cosine to 0 after the same warmup
(ours `train.min_lr_ratio=0`), clipping at 1.0 (theirs is hard-coded; ours `train.max_grad_norm=1.0`),
fp32 on CPU. What differs, by their trainer's design or because it cannot be set:
- speculators freezes the draft `lm_head` (speculators/model.py: `lm_head.weight.requires_grad = False`);
  ours trains it.
- initial weights: theirs start from ours (their own CLI would copy the same lm_head rows from the
  verifier, but start the final norm at ones where ours starts from the target's, and draw fc / layer
  weights from another random init).
- their warmup factor is step/warmup (transformers' scheduler), ours (step+1)/warmup.
- their AdamW betas are torch's default (0.9, 0.999), not configurable in TrainerConfig; this script sets
  their param groups' betas to ours (`train.betas`). The only other changes, both for CPU: their
  `get_local_rank` -> "cpu" (their single-process path calls `model.to(0)`, a CUDA device) and, while
  their epoch runs, `torch.accelerator.synchronize` a no-op (their step timer calls it; it raises
  without an accelerator, and CPU work is synchronous anyway).
- attention: their default flex attention has no CPU path; `--their-attn sdpa` (default) gives their
  model transformers' SDPA with a dense bool mask from their `create_mask`, `eager` the float mask their
  CPU tests use. Either way the mask spans the packed sequence, [N, (k+1)N] at TTT step k with N = the
  step's tokens (their design: documents packed in one row); ours attends per row, [T, T] causal plus
  k diagonal terms (train/objectives/ttt_attention.py). On a GPU their flex attention would skip the masked
  blocks.
- position ids start at 1 in theirs (their shift), at 0 in ours: RoPE is relative, equal up to rounding.
- speculators runs under `torch.autocast(device_type)`; on CPU without an accelerator it asks for "cuda",
  which torch disables with a warning: fp32 throughout, as ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]


# ---- setup ---------------------------------------------------------------------------------------------
def smoke_overrides(out: Path) -> list[str]:
    """The tests' tiny random target (3 layers, 128 tokens) and counting conversations."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_tiny_dir
    from train_data import tiny_train_overrides, write_conversations

    target = out / "tiny-target"
    if not (target / "config.json").is_file():
        make_tiny_dir(target)
    source = write_conversations(out / "convs.jsonl", n=60)
    return [
        f"target={target}",
        *tiny_train_overrides(source, out / "data"),
        "train.batch_size=2",
        "train.ttt_steps=3",
        "eval.max_rows=8",
    ]


def matched_overrides(steps: int, out: Path) -> list[str]:
    """What makes our run match what speculators' trainer can do (module docstring)."""
    return [
        f"train.max_steps={steps}",
        "train.min_lr_ratio=0",
        "train.max_grad_norm=1.0",
        "train.grad_accum=1",
        "eval.every=0",
        "log.progress=false",
        f"output_dir={out / 'ours'}",
    ]


def effective_warmup(cfg) -> int:
    return min(cfg.train.warmup_steps, cfg.train.max_steps // 10)  # train/loop/trainer.py lr_lambda


def target_path(cfg) -> Path:
    from draftsmith.runtime.core.targets import resolve_target

    return Path(resolve_target(cfg.target).path)


# ---- layouts: our head <-> speculators' Eagle3DraftModel ----------------------------------------------
def to_their_model(head, verifier: Path, folder: Path, attn: str = "eager"):
    """Our head (any weights) -> speculators' Eagle3DraftModel with exactly those weights, via our
    `to_speculators` export and their `from_pretrained` (the verifier embedding reloaded, as the interop
    test does)."""
    import speculators
    from safetensors.torch import save_file

    from draftsmith.runtime.heads.layouts import to_speculators

    config, tensors = to_speculators(head, verifier=str(verifier))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    spec_config = speculators.Eagle3SpeculatorConfig.from_pretrained(str(folder))
    spec_config.transformer_layer_config._attn_implementation = attn
    model = speculators.SpeculatorModel.from_pretrained(str(folder), config=spec_config).float()
    model._load_verifier_weights(overwrite_embed_tokens=True)
    return model


def from_their_model(model, folder: Path, target) -> dict:
    """speculators' model -> our head's state dict: its `save_pretrained`, then our `load_eagle3`."""
    from draftsmith.runtime.heads.layouts import load_eagle3

    model.save_pretrained(str(folder))
    return {k: v.clone() for k, v in load_eagle3(str(folder), target).state_dict().items()}


# ---- data: our micro-batch -> their packed batch -------------------------------------------------------
@torch.no_grad()
def in_draft_vocab(head, target, hidden: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """hidden [n, Ht] the target's last pre-norm states -> [n] bool: the target's argmax is a draft token."""
    out = [head.t2d[target.logits(hidden[s : s + chunk]).argmax(-1)] for s in range(0, len(hidden), chunk)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def their_batch(head, target, inputs: dict) -> dict:
    """Our model inputs (input_ids [B, T], features [B, T, A*Ht], target_hidden [B, T, Ht], loss_mask,
    valid) -> speculators' collated batch for the same rows: raw samples packed back to back by their
    CollateFn after their shift_batch, no padding. Their raw mask at p (0-based in the row) gates every
    prediction scored against the target's distribution at p (align_for_step), i.e. of token p + 1; ours
    counts that prediction when token p + 1 is supervised and the target's argmax at p is a draft token
    (ttt_loss): the raw mask carries exactly that, so both count the same positions."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn

    samples = []
    for b in range(inputs["input_ids"].shape[0]):
        n = int(inputs["valid"][b].sum())
        hidden = inputs["target_hidden"][b, :n]  # [n, Ht]
        mask = torch.zeros(n, dtype=torch.bool)
        mask[:-1] = inputs["loss_mask"][b, 1:n].cpu() > 0
        mask &= in_draft_vocab(head, target, hidden).cpu()
        samples.append(
            {
                "hidden_states": inputs["features"][b, :n].float().cpu(),  # [n, A*Ht]
                "input_ids": inputs["input_ids"][b, :n].cpu(),  # [n]
                "verifier_last_hidden_states": hidden.float().cpu(),  # [n, Ht]
                "loss_mask": mask,  # [n]
                "lengths": torch.tensor([n]),
                "position_ids": torch.arange(n),
            }
        )
    width, aux = (
        inputs["target_hidden"].shape[-1],
        inputs["features"].shape[-1] // inputs["target_hidden"].shape[-1],
    )
    total = sum(len(s["input_ids"]) - 1 for s in samples)
    return CollateFn(total, width, num_target_layers=aux, dtype=torch.float32, preprocess=shift_batch)(
        samples
    )


class StepLoader:
    """What their Trainer iterates: per step, the rows ours trained on, packed their way (built lazily)."""

    def __init__(self, build, steps_rows: list):
        self.build, self.steps_rows, self.batch_sampler = build, steps_rows, None

    def __len__(self) -> int:
        return len(self.steps_rows)

    def __iter__(self):
        for rows in tqdm(self.steps_rows, desc="speculators' Trainer", unit="step"):  # the ETA of their half
            yield self.build(rows)


# ---- the two runs ---------------------------------------------------------------------------------------
def run_ours(trainer, steps: int) -> tuple[list[float], list[int], list[list]]:
    """`steps` train_step()s -> (model seconds per step, tokens per step, the rows of every step)."""
    kind, spent, recorded = trainer.kind, [0.0], []
    build = kind.batch

    def timed_batch(rows, device):  # the online target forward: data preparation, not training
        start = time.perf_counter()
        out = build(rows, device)
        spent[0] += time.perf_counter() - start
        recorded.append(list(rows))
        return out

    kind.batch = timed_batch
    seconds, tokens = [], []
    try:
        for _ in tqdm(range(steps), desc="draftsmith's Trainer", unit="step"):
            spent[0], start = 0.0, time.perf_counter()
            totals = trainer.train_step()
            seconds.append(time.perf_counter() - start - spent[0])
            tokens.append(totals["tokens"])
    finally:
        kind.batch = build
    return seconds, tokens, recorded


def run_theirs(trainer, model, steps_rows: list, folder: Path) -> list[float]:
    """speculators' Trainer.train_epoch on the recorded rows -> their model seconds per step."""
    import speculators.train.trainer as their_trainer
    from speculators.losses import resolve_loss_config

    cfg, t = trainer.cfg, trainer.cfg.train
    their_trainer.get_local_rank = lambda: 0 if torch.cuda.is_available() else "cpu"  # CPU: not cuda:0
    kwargs = {
        "ttt_steps": t.ttt_steps,
        "ttt_step_loss_decay": t.step_decay,
        "loss_config": resolve_loss_config("kl_div", "eager"),
    }
    config = their_trainer.TrainerConfig(
        lr=t.lr,
        num_epochs=1,
        save_path=str(folder),
        train_call_kwargs=kwargs,
        val_call_kwargs=kwargs,
        weight_decay=t.weight_decay,
        scheduler_type="cosine",
        scheduler_warmup_steps=effective_warmup(cfg),
        scheduler_total_steps=len(steps_rows),
        hidden_states_dtype=torch.float32,
        log_freq=1,
        max_steps=len(steps_rows),
    )
    loader = StepLoader(
        lambda rows: their_batch(trainer.head, trainer.target, make_inputs(trainer, rows)), steps_rows
    )
    ours_spec = their_trainer.Trainer(model, config, loader)
    for opt in ours_spec.optimizers:  # betas are not in their TrainerConfig (module docstring)
        for group in opt.param_groups:
            group["betas"] = tuple(t.betas)
    profiles = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: (
        profiles.append(record.msg.get("profile")) if isinstance(record.msg, dict) else None
    )
    metrics = logging.getLogger("speculators.metrics")
    metrics.addHandler(handler)
    metrics.setLevel(logging.INFO)
    metrics.propagate = False
    synchronize = torch.accelerator.synchronize
    if not torch.accelerator.is_available():  # their step timer syncs; CPU work is synchronous already
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast("cuda") on CPU, past_key_values renames
            ours_spec.train_epoch(0)
    finally:
        metrics.removeHandler(handler)
        torch.accelerator.synchronize = synchronize
    return [(p["fwd_ms"] + p["bwd_ms"] + p["opt_ms"]) / 1000 for p in profiles if p]


def make_inputs(trainer, rows) -> dict:
    return trainer.kind.batch(rows, trainer.acc.device)


# ---- the checks -----------------------------------------------------------------------------------------
def evaluate_state(trainer, state: dict, keep: Path | None = None) -> dict:
    """THE evaluation of both heads: draftsmith's Trainer.evaluate() with `state` in the trainer's head
    (saved to `keep` first, in our layout, for `--draft eagle3:KEEP`, when given)."""
    trainer.head.load_state_dict(state)
    if keep is not None:
        from draftsmith.runtime.heads.eagle3 import save_head

        save_head(trainer.head, keep)
    return trainer.evaluate()


def roundtrip_check(trainer, work: Path) -> tuple[dict, dict]:
    """A known head (the initial one) scored directly and after our -> speculators -> our conversion,
    the path the speculators-trained head takes: the two evaluations must be equal."""
    state = {k: v.clone() for k, v in trainer.head.state_dict().items()}
    direct = evaluate_state(trainer, state)
    model = to_their_model(trainer.head, target_path(trainer.cfg), work / "roundtrip-in")
    back = evaluate_state(trainer, from_their_model(model, work / "roundtrip-out", trainer.target))
    trainer.head.load_state_dict(state)
    return direct, back


@torch.no_grad()
def logits_check(trainer, model, rows) -> dict:
    """Their forward on their packed batch vs our TTT unroll on our batch, same head weights: per step,
    our counted positions (ttt_loss) and theirs (align_for_step on the folded mask) must be the same count,
    and the draft logits there the same up to rounding. -> counts and the max |difference| / max |logit|."""
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3.metrics import align_for_step

    from draftsmith.train.objectives.eagle3_objective import unroll

    inputs, steps = make_inputs(trainer, rows), trainer.cfg.train.ttt_steps
    trainer.model.eval()
    _, _, counted = trainer.model(**inputs)
    outputs = unroll(trainer.head, trainer.target.embed, inputs["input_ids"], inputs["features"], steps)
    ours = [trainer.head.draft_logits(h) for h in outputs]  # K x [B, T, Vd]
    batch = their_batch(trainer.head, trainer.target, inputs)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out))
    model.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            model(**tensors, ttt_steps=steps, loss_config=resolve_loss_config("kl_div", "eager"))
    finally:
        hook.remove()
    lengths = inputs["valid"].sum(1).tolist()
    starts = [sum(n - 1 for n in lengths[:b]) for b in range(len(lengths))]
    their_counted, diff, scale = [], 0.0, 0.0
    for k, logits in enumerate(seen):  # [1, N, Vd]
        _, _, mask, _ = align_for_step(logits, logits, batch["loss_mask"], None, k)
        their_counted.append(int(mask.sum()))
        for b, (start, n) in enumerate(zip(starts, lengths)):
            t = torch.nonzero(mask[0, start : start + n - 1 - k]).flatten()  # positions t in row b
            if len(t):
                a, o = logits[0, start + t], ours[k][b, t]
                diff, scale = max(diff, float((a - o).abs().max())), max(scale, float(o.abs().max()))
    trainer.model.train()
    return {
        "ours_counted": [int(c) for c in counted[:steps]],
        "their_counted": their_counted,
        "max_abs_diff": diff,
        "max_abs_logit": scale,
    }


# ---- the table ------------------------------------------------------------------------------------------
def summary(name: str, seconds: list, tokens: list, warmup: int, evaluation: dict, module) -> dict:
    timed_s, timed_tokens = sum(seconds[warmup:]), sum(tokens[warmup:])
    return {
        "trainer": name,
        "steps": len(seconds),
        "timed_steps": len(seconds[warmup:]),
        "tokens_per_s": round(timed_tokens / timed_s, 1) if timed_s > 0 else float("nan"),
        "s_per_step": round(timed_s / max(1, len(seconds[warmup:])), 4),
        "val_accuracy_per_step": evaluation["accuracy_per_step"],
        "val_simulated_tau": evaluation["simulated_tau"],
        "val_loss": round(evaluation["loss"], 5),
        "val_rows": evaluation["rows"],
        "trainable_params": sum(p.numel() for p in module.parameters() if p.requires_grad),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| trainer | steps | tokens/s | s/step | val acc per TTT step | sim. tau |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = " ".join(f"{a:.3f}" for a in r["val_accuracy_per_step"])
        lines.append(
            f"| {r['trainer']} | {r['steps']} | {r['tokens_per_s']} | {r['s_per_step']} | {acc} | "
            f"{r['val_simulated_tau']} |"
        )
    return "\n".join(lines)


def compare(
    config: Path, out: Path, steps: int, warmup: int, smoke: bool, overrides: list[str], attn: str = "sdpa"
) -> dict:
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.trainer import Trainer

    out.mkdir(parents=True, exist_ok=True)
    base = smoke_overrides(out) if smoke else []
    trainer = Trainer(load_train_config(config, [*base, *overrides, *matched_overrides(steps, out)]))
    initial = {k: v.clone() for k, v in trainer.head.state_dict().items()}
    direct, back = roundtrip_check(trainer, out / "work")
    model = to_their_model(trainer.head, target_path(trainer.cfg), out / "work" / "theirs-init", attn)
    seconds, tokens, steps_rows = run_ours(trainer, steps)
    check = logits_check(
        trainer,
        to_their_model(trainer.head, target_path(trainer.cfg), out / "work" / "check", attn),
        steps_rows[0],
    )
    ours = summary(
        "draftsmith",
        seconds,
        tokens,
        warmup,
        evaluate_state(trainer, trainer.head.state_dict(), out / "heads" / "draftsmith"),
        trainer.head,
    )
    their_seconds = run_theirs(trainer, model, steps_rows, out / "work" / "theirs-run")
    their_state = from_their_model(model, out / "work" / "theirs-final", trainer.target)
    theirs = summary(
        "speculators",
        their_seconds,
        tokens,
        warmup,
        evaluate_state(trainer, their_state, out / "heads" / "speculators"),
        model,
    )
    trainer.head.load_state_dict(initial)
    result = {
        "rows": [ours, theirs],
        "tokens_per_s_ratio": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3),
        "roundtrip": {
            "direct": direct["accuracy_per_step"],
            "converted": back["accuracy_per_step"],
            "initial_val_loss": direct["loss"],
            "equal": direct == back,
        },
        "logits_check": check,
        "their_attention": attn,
        "config": str(config),
        "overrides": [*overrides, *matched_overrides(steps, out)],
    }
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    (out / "compare.md").write_text(table(result["rows"]) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "eagle3-smollm2-135m.yaml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps for each trainer")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of tokens/s")
    parser.add_argument("--smoke", action="store_true", help="the tests' tiny target and data, 6 steps")
    parser.add_argument(
        "--their-attn", choices=("sdpa", "eager"), default="sdpa", help="speculators' attention on CPU"
    )
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for both runs")
    args = parser.parse_args()
    steps = 6 if args.smoke and args.steps == 100 else args.steps
    warmup = min(args.warmup, steps - 1) if args.smoke else args.warmup
    if steps <= warmup:
        from draftsmith.runtime.errors import BadInputError

        raise BadInputError("--steps", steps, f"more than --warmup ({warmup})")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = compare(args.config, args.out, steps, warmup, args.smoke, args.overrides, args.their_attn)
    print(table(result["rows"]))
    print(json.dumps({k: result[k] for k in ("tokens_per_s_ratio", "roundtrip", "logits_check")}))
    if not all(math.isfinite(r["tokens_per_s"]) for r in result["rows"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
