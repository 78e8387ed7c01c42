"""`draftsmith demo`: the main job on the embedded defaults: data -> train -> head -> bench -> export.

    draftsmith demo --quick            # a short training run and a small bench (well under 15 minutes)
    draftsmith demo                    # the full CPU recipe (configs/eagle3-smollm2-135m.yaml, ~1.5 h)

1. data + train: `draftsmith train` with the config named by `train_config` (the data steps run or are
   reused from the cache; a finished run is reused, an interrupted one resumes);
2. head: `output_dir/final/` of that run, in draftsmith's layout (engine layouts: `draftsmith export`);
3. bench: `draftsmith bench` at batch 1 on held-out prompts (`prompt_set`): plain decoding,
   transformers `generate()` and prompt lookup, and the trained head (chain and dynamic tree) side by
   side, greedy tokens checked against plain decoding; prints the table and writes the bench's
   `out_dir/bench/` (results.json, meta.json, report.md, plots), plus `out_dir/results.json` (the run's
   summary) and the resolved `out_dir/config.yaml`;
4. export: the head in each of `export_formats` (default: the official/SGLang EAGLE-3 layout and vLLM's
   speculators layout) under `out_dir/export-FORMAT/`, each with a model card holding the bench rows.
"""

from __future__ import annotations

import json
import logging
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path

import torch

from draftsmith.runtime.bench.types import is_baseline
from draftsmith.runtime.core.config import atomic_write_text, load_config, save_config
from draftsmith.runtime.core.errors import BadInputError, DraftsmithError

log = logging.getLogger("draftsmith")
QUICK_TRAIN = [  # --quick: about 5 minutes of training on 2 cores
    "data.max_samples=400",
    "data.max_length=256",
    "train.max_steps=40",
    "train.warmup_steps=4",
    "eval.every=20",
    "eval.max_rows=8",
    "checkpoint.every=20",
]


@dataclass
class DemoConfig:
    target: str = "smollm2-135m"  # alias, folder, Hub id or .gguf
    train_config: str = "eagle3-smollm2-135m.yaml"  # a packaged config name or a YAML path
    train_overrides: list[str] = field(default_factory=list)  # key=value for the train config
    prompt_set: str = "sharegpt"  # held-out bench prompts: sharegpt, humaneval or jsonl:FILE
    num_prompts: int = 10
    max_new_tokens: int = 64
    repeats: int = 1  # timed runs per prompt and method; the median is reported
    temperature: float = 0.0
    methods: list[str] = field(
        default_factory=lambda: [
            "hf",
            "hf-prompt-lookup",
            "ngram@chain:2",
            "eagle3:{head}@chain:2",
            "eagle3:{head}@dynamic:depth=3,topk=4,tokens=8",
        ]
    )  # {head} = the trained head folder
    export_formats: list[str] = field(default_factory=lambda: ["eagle3", "speculators"])
    device: str = "auto"
    dtype: str = "auto"
    out_dir: str = "runs/demo"

    def validate(self) -> None:
        for key in ("num_prompts", "max_new_tokens", "repeats"):
            if getattr(self, key) < 1:
                raise BadInputError(key, getattr(self, key), "an integer >= 1")
        if not self.methods:
            raise BadInputError("methods", self.methods, "at least one method")
        for method in self.methods:
            if not is_baseline(method) and "@" not in method:
                raise BadInputError("methods", method, "a bench baseline (hf, ...) or DRAFT@TREE")
        kind = self.head_kind()
        for fmt in self.export_formats:  # refused now, not after the training run
            if fmt not in kind.all_layouts():
                fits = list(kind.all_layouts())
                raise BadInputError("export_formats", fmt, f"formats for a {kind.name} head: {fits}")

    def head_kind(self):
        """The kind of head the train config (with its overrides) trains, read from the YAML alone."""
        from draftsmith.runtime.core.config import apply_override, read_yaml
        from draftsmith.runtime.heads import head_kinds

        data = read_yaml(train_config_path(self.train_config))
        for item in self.train_overrides:
            apply_override(data, item)
        head = data.get("head") if isinstance(data.get("head"), dict) else {}
        return head_kinds.get(head.get("type", head_kinds.DEFAULT_KIND), "train_config head.type")


def default_config_path() -> Path:
    return Path(str(files("draftsmith.configs") / "demo-smollm2-135m.yaml"))


def train_config_path(name: str) -> Path:
    packaged = Path(str(files("draftsmith.configs") / name))
    return packaged if packaged.is_file() else Path(name)


def train_head(cfg: DemoConfig, quick: bool):
    """Steps 1-2: train (or reuse / resume) the head; -> (head folder, last evaluation row, the target
    the trainer loaded, reused by the bench instead of loading it twice)."""
    from draftsmith.train.config import load_train_config
    from draftsmith.train.trainer import Trainer

    overrides = [f"target={cfg.target}", f"device={cfg.device}", f"dtype={cfg.dtype}"]
    if quick:
        overrides += [*QUICK_TRAIN, f"output_dir={Path(cfg.out_dir) / 'head-run'}"]
    train_cfg = load_train_config(train_config_path(cfg.train_config), overrides + cfg.train_overrides)
    log.info("demo 1/4: data + train -> %s (%d steps)", train_cfg.output_dir, train_cfg.train.max_steps)
    trainer = Trainer(train_cfg)
    last_eval = trainer.fit()
    return Path(train_cfg.output_dir) / "final", last_eval, trainer.target


def demo_main(config_path: str | None, overrides: list[str], quick: bool = False) -> dict:
    from draftsmith.runtime.bench.prompt_sets import load_prompt_set

    cfg = load_config(DemoConfig, config_path or default_config_path(), overrides)
    if quick:
        cfg.num_prompts, cfg.max_new_tokens, cfg.repeats = (
            min(cfg.num_prompts, 4),
            min(cfg.max_new_tokens, 32),
            1,
        )
        cfg.out_dir = str(Path(cfg.out_dir).with_name(Path(cfg.out_dir).name + "-quick"))
    cfg.validate()
    out = Path(cfg.out_dir)
    load_prompt_set(cfg.prompt_set, cfg.num_prompts)  # bad input fails before training
    head, last_eval, target = train_head(cfg, quick)
    log.info("demo 2/4: head %s (simulated tau on validation %.2f)", head, last_eval["simulated_tau"])
    command = "draftsmith demo" + (" --quick" if quick else "") + "".join(f" {o}" for o in overrides)
    rows = bench_head(cfg, head, target, out / "bench", command)["rows"]  # prints its table as it goes
    result = {
        "command": command,
        "config": asdict(cfg),
        "head": str(head),
        "head_validation": last_eval,
        "bench": str(out / "bench"),
        "rows": rows,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "target": target.name,
            "device": str(target.device),
            "dtype": str(target.dtype),
        },
    }
    save_config(cfg, out / "config.yaml")
    atomic_write_text(out / "results.json", json.dumps(result, indent=2))
    log.info("wrote %s and %s", out / "results.json", out / "config.yaml")
    result["exports"] = export_head(cfg, head, out / "bench" / "results.json", out)
    broken = [
        r["method"] for r in rows if r.get("greedy_identical") is False and not r.get("greedy_near_ties_only")
    ]
    if broken:
        raise DraftsmithError(f"greedy tokens differ from plain decoding for {broken}: see results.json")
    return result


def bench_head(cfg: DemoConfig, head: Path, target, folder: Path, command: str) -> dict:
    """Step 3: `draftsmith bench` at batch 1: plain + the configured baselines and DRAFT@TREE methods."""
    from draftsmith.runtime.bench.run import BenchRequest, run_bench

    methods = [m.replace("{head}", str(head)) for m in cfg.methods]
    log.info("demo 3/4: bench on %d held-out %s prompts, %d new tokens", cfg.num_prompts, cfg.prompt_set,
             cfg.max_new_tokens)  # fmt: skip
    request = BenchRequest(
        target=cfg.target,
        drafts=[m for m in methods if not is_baseline(m)],
        prompts=cfg.prompt_set,
        num_prompts=cfg.num_prompts,
        max_new_tokens=cfg.max_new_tokens,
        temperatures=[cfg.temperature],
        batch_sizes=[1],
        baselines=["plain", *[m for m in methods if is_baseline(m) and m != "plain"]],
        repeats=cfg.repeats,
        out=str(folder),
        device=cfg.device,
        dtype=cfg.dtype,
        command=command,
    )
    return run_bench(request, target=target)


def export_head(cfg: DemoConfig, head: Path, bench: Path, out: Path) -> list[str]:
    """Step 4: the head in each export format, its model card quoting this run's bench rows."""
    from draftsmith.train.export import ExportRequest, export

    folders = []
    for fmt in cfg.export_formats:
        request = ExportRequest(str(head), fmt, str(out / f"export-{fmt}"), bench=str(bench), overwrite=True)
        folders.append(str(export(request)))
    log.info("demo 4/4: exported %s", ", ".join(folders) or "nothing (export_formats is empty)")
    return folders
