"""`draftsmith demo`: the main job on the embedded defaults: head -> bench -> export (-> train on request).

    draftsmith demo                    # the shipped head (heads/eagle3-smollm2-135m): bench + export, minutes
    draftsmith demo --train            # train a new head with the full CPU recipe first (about an hour)
    draftsmith demo --quick            # a 40-step head and a small bench: the whole pipeline in minutes

1. head: `head` names a shipped head (a folder of heads/, trained by the shipped recipe; its README says
   by which command, commit and machine) or any head folder. With `--train` (or `head: ""`), data + train
   run first: `draftsmith train` with the config named by `train_config` (the data steps run or are
   reused from the cache; a finished run is reused, an interrupted one resumes), and the head is that
   run's `output_dir/final/`, in draftsmith's layout (engine layouts: `draftsmith export`);
2. the head is loaded strictly against the target (a head for another target is refused, saying how to
   train one);
3. bench: `draftsmith bench` at batch 1 on held-out prompts (`prompt_set`): plain decoding,
   transformers `generate()` and prompt lookup, and the trained head (chain and dynamic tree) side by
   side, greedy tokens checked against plain decoding; prints the table and writes the bench's
   `out_dir/bench/` (results.json, meta.json, report.md, plots), plus `out_dir/results.json` (the run's
   summary) and the resolved `out_dir/config.yaml`;
   Then, where verification is cheap: the same prompts on the target quantized to `quantized` (int4
   by default, weight-only, CPU kernels), its plain decoding against `quantized_methods` (suffix decoding),
   interleaved, under `out_dir/bench-QUANTIZED/`: speedups over that target's own plain decoding;
   and each target's verify-cost curve (one forward over n tokens, the bench's own measurement);
4. export: the head in each of `export_formats` (default: the official/SGLang EAGLE-3 layout and vLLM's
   speculators layout) under `out_dir/export-FORMAT/`, each with a model card holding the bench rows.

The demo ends with the rows of both targets side by side and a reading of them (runtime/bench/reading.py:
tau, the verify-cost curve, why a drafter lost or won, where published results say the head pays), printed
and written to `out_dir/summary.md`.
"""

from __future__ import annotations

import json
import logging
import platform
import textwrap
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path

import torch

from draftsmith.runtime.bench.reading import Block, curve_table, reading, side_by_side, verified_tokens
from draftsmith.runtime.bench.types import is_baseline
from draftsmith.runtime.core.config import atomic_write_text, load_config, save_config
from draftsmith.runtime.core.quantize import check_device, parse_quantize
from draftsmith.runtime.core.row_linear import check_mode
from draftsmith.runtime.errors import (
    BadInputError,
    DraftsmithError,
    check_output_dir,
    read_json,
    renamed_fields,
)

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


# The flags of the verbs the demo runs inside (bench, export, Target.load) -> the demo key that sets them:
# errors name what the user typed.
DEMO_FIELDS = {
    "--target": "target",
    "--device": "device",
    "--dtype": "dtype",
    "--prompts": "prompt_set",
    "--num-prompts": "num_prompts",
    "--max-new-tokens": "max_new_tokens",
    "--repeats": "repeats",
    "--temperatures": "temperature",
    "--cpu-linears": "cpu_linears",
    "--baselines": "methods",
    "--draft": "methods",
    "--tree": "methods",
    "method": "methods",
    "--out": "out_dir",
    "--format": "export_formats",
    "--quantize": "quantized",
}
QUANTIZED_FIELDS = {
    "--draft": "quantized_methods",
    "--tree": "quantized_methods",
    "method": "quantized_methods",
}


@dataclass
class DemoConfig:
    target: str = "smollm2-135m"  # alias, folder, Hub id or .gguf
    head: str = ""  # a shipped head (heads/NAME) or a head folder; "" = train one with train_config
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
    # where verification is cheap: the same prompts on the target weight-only quantized (none: skipped),
    # its plain decoding against these DRAFT@TREE methods ({head} allowed), interleaved
    quantized: str = "int4"
    quantized_methods: list[str] = field(default_factory=lambda: ["suffix@chain:2"])
    device: str = "auto"
    dtype: str = "auto"
    cpu_linears: str = "auto"  # auto | torch (runtime/core/row_linear.py)
    out_dir: str = "runs/demo"

    def validate(self) -> None:
        for key in ("num_prompts", "max_new_tokens", "repeats"):
            if getattr(self, key) < 1:
                raise BadInputError(key, getattr(self, key), "an integer >= 1")
        if not self.methods:
            raise BadInputError("methods", self.methods, "at least one method")
        check_mode("cpu_linears", self.cpu_linears)
        check_output_dir("out_dir", self.out_dir)  # before training: bench/, export-*/ and results go there
        for method in self.methods:
            if not is_baseline(method) and "@" not in method:
                raise BadInputError("methods", method, "a bench baseline (hf, ...) or DRAFT@TREE")
        if parse_quantize(self.quantized, None, "quantized") is not None:
            if not self.quantized_methods:
                raise BadInputError("quantized_methods", self.quantized_methods, "at least one DRAFT@TREE")
            for method in self.quantized_methods:
                if is_baseline(method) or "@" not in method:
                    raise BadInputError("quantized_methods", method, "DRAFT@TREE (plain runs anyway)")
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


def shipped_heads() -> dict[str, Path]:
    """Name -> folder of the heads shipped in the repository (heads/NAME/, package draftsmith.heads)."""
    root = Path(str(files("draftsmith.heads")))
    return {p.name: p for p in sorted(root.iterdir()) if (p / "config.json").is_file()}


def resolve_head(name: str) -> Path:
    """`head`: a shipped head's name or a head folder -> the folder (bad input names the choices)."""
    folder = shipped_heads().get(name, Path(name))
    if not (folder / "config.json").is_file():
        raise BadInputError(
            "head", name, f"a shipped head ({', '.join(shipped_heads()) or 'none'}) or a head folder; "
            "or `draftsmith demo --train` to train one"
        )  # fmt: skip
    try:  # heads/NAME rather than /abs/path/heads/NAME in bench rows and model cards, run from the repo
        return folder.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return folder


def use_head(cfg: DemoConfig):
    """Steps 1-2 without training: the head `cfg.head` names, loaded strictly against the target ->
    (head folder, its training's last evaluation row or None, the target, reused by the bench)."""
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.heads import head_kinds

    folder = resolve_head(cfg.head)
    kind, expected = head_kinds.of_folder(folder, "head"), cfg.head_kind()
    if kind is not expected:
        raise BadInputError(
            "head", str(folder), f"a {expected.name} head (the demo's methods draft with one)"
        )
    target = Target.load(cfg.target, device=cfg.device, dtype=cfg.dtype)
    try:
        kind.module_class().from_pretrained(folder, target)
    except BadInputError as err:
        raise BadInputError(
            "head", str(folder), f"a head for the target {cfg.target}: `draftsmith demo --train` trains one",
            str(err),
        ) from None  # fmt: skip
    record = folder / "training.json"  # shipped heads: how they were trained (scripts/ship_head.py)
    last_eval = read_json(record, "head training.json").get("validation") if record.is_file() else None
    log.info("demo 1/4: no training: the head %s (`draftsmith demo --train` trains a new one)", folder)
    return folder, last_eval, target


def expected_training_time(steps: int, train_config: str) -> str:
    """What the shipped head trained by the same recipe (`train_config`'s file name) took, scaled to
    `steps`: the up-front estimate for --train (other recipes' heads step at other speeds)."""
    for folder in shipped_heads().values():
        record = folder / "training.json"
        done = read_json(record, "head training.json") if record.is_file() else {}
        if done.get("config_name") == Path(train_config).name:
            # per step alone on the machine, where it was shared
            per_step = done.get("seconds_per_step_alone") or done["train_seconds"] / done["steps"]
            minutes = per_step * steps / 60
            return f"about {minutes:.0f} min, as the shipped head took on {done['machine']}"
    return "no shipped head of this recipe to estimate from"


def train_head(cfg: DemoConfig, quick: bool):
    """Steps 1-2: train (or reuse / resume) the head; -> (head folder, last evaluation row, the target
    the trainer loaded, reused by the bench instead of loading it twice)."""
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.trainer import Trainer

    overrides = [f"target={cfg.target}", f"device={cfg.device}", f"dtype={cfg.dtype}"]
    if quick:
        overrides += [*QUICK_TRAIN, f"output_dir={Path(cfg.out_dir) / 'head-run'}"]
    train_cfg = load_train_config(train_config_path(cfg.train_config), overrides + cfg.train_overrides)
    steps = train_cfg.train.max_steps
    log.info("demo 1/4: data + train -> %s (%d steps; %s; the bar shows this machine's ETA)",
             train_cfg.output_dir, steps, expected_training_time(steps, cfg.train_config))  # fmt: skip
    trainer = Trainer(train_cfg)
    last_eval = trainer.fit()
    return Path(train_cfg.output_dir) / "final", last_eval, trainer.target


def demo_main(
    config_path: str | None, overrides: list[str], quick: bool = False, train: bool = False
) -> dict:
    with renamed_fields(DEMO_FIELDS):  # bench's --prompts is the demo's prompt_set, ...
        return _demo(config_path, overrides, quick, train)


def _demo(config_path: str | None, overrides: list[str], quick: bool, train: bool) -> dict:
    from draftsmith.runtime.bench.prompt_sets import load_prompt_set

    cfg = demo_config(config_path, overrides, quick, train)
    out = Path(cfg.out_dir)
    load_prompt_set(cfg.prompt_set, cfg.num_prompts)  # bad input fails before training
    head, last_eval, target = use_head(cfg) if cfg.head else train_head(cfg, quick)
    tau = f"{last_eval['simulated_tau']:.2f}" if last_eval else "not recorded"
    log.info("demo 2/4: head %s (simulated tau on validation %s)", head, tau)
    flags = (" --quick" if quick else "") + (" --train" if train else "")
    command = "draftsmith demo" + flags + "".join(f" {o}" for o in overrides)
    blocks = bench_blocks(cfg, head, target, command)
    sentences = reading(blocks)
    result = demo_result(cfg, command, head, last_eval, blocks, sentences)
    result["machine"] = machine_facts(target)
    save_config(cfg, out / "config.yaml")
    atomic_write_text(out / "results.json", json.dumps(result, indent=2))
    atomic_write_text(out / "summary.md", summary_markdown(command, blocks, sentences))
    log.info("wrote %s, %s and %s", out / "results.json", out / "summary.md", out / "config.yaml")
    result["exports"] = export_head(cfg, head, out / "bench" / "results.json", out)
    print_reading(blocks, sentences, out / "summary.md")
    check_greedy(blocks)
    return result


def demo_config(config_path: str | None, overrides: list[str], quick: bool, train: bool) -> DemoConfig:
    """The YAML with its overrides; --quick and --train train a head (--quick: 4 prompts x 32 tokens, once,
    into OUT-quick); checked."""
    cfg = load_config(DemoConfig, config_path or default_config_path(), overrides)
    if quick or train:  # --quick checks the training pipeline too: its 40-step head
        cfg.head = ""
    if quick:
        cfg.num_prompts, cfg.max_new_tokens, cfg.repeats = (
            min(cfg.num_prompts, 4),
            min(cfg.max_new_tokens, 32),
            1,
        )
        cfg.out_dir = str(Path(cfg.out_dir).with_name(Path(cfg.out_dir).name + "-quick"))
    cfg.validate()
    return cfg


def bench_blocks(cfg: DemoConfig, head: Path, target, command: str) -> list[Block]:
    """Step 3: the rows of the target (and of its quantized copy, where verification is cheap), each with
    its verify-cost curve."""
    out = Path(cfg.out_dir)
    rows = bench_head(cfg, head, target, out / "bench", command)["rows"]  # prints its table as it goes
    blocks = [Block(weights_label(target), rows, verify_curve(target, [r["method"] for r in rows]))]
    quantized = bench_quantized(cfg, head, target, out / f"bench-{cfg.quantized}", command)
    if quantized is not None:
        qrows, qtarget = quantized
        blocks.append(Block(qtarget.quantization, qrows, verify_curve(qtarget, [r["method"] for r in qrows])))
        del qtarget  # its weights: the export needs none
    return blocks


def demo_result(cfg: DemoConfig, command: str, head: Path, last_eval, blocks: list[Block], sentences) -> dict:
    """OUT/results.json: the command, config, head, each block's rows and verify costs, the reading."""
    out = Path(cfg.out_dir)
    quantized = None
    if len(blocks) > 1:
        quantized = {
            "weights": blocks[1].label,
            "bench": str(out / f"bench-{cfg.quantized}"),
            "rows": blocks[1].rows,
        }
    return {
        "command": command,
        "config": asdict(cfg),
        "head": str(head),
        "head_trained_here": not cfg.head,
        "head_validation": last_eval,
        "bench": str(out / "bench"),
        "rows": blocks[0].rows,
        "quantized": quantized,
        "verify_cost_ms": {b.label: b.verify_ms for b in blocks},  # one forward over n = 1, 2, ... tokens
        "reading": sentences,
    }


def machine_facts(target) -> dict:
    """results.json's `machine`: where the rows ran."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target.name,
        "device": str(target.device),
        "dtype": str(target.dtype),
    }


def check_greedy(blocks: list[Block]) -> None:
    """The demo fails (after writing everything) if a row's greedy tokens differ from plain decoding's
    other than at near ties."""
    broken = [
        f"{b.label} {r['method']}"
        for b in blocks
        for r in b.rows
        if r.get("greedy_identical") is False and not r.get("greedy_near_ties_only")
    ]
    if broken:
        raise DraftsmithError(f"greedy tokens differ from plain decoding for {broken}: see results.json")


def bench_request(
    cfg: DemoConfig, folder: Path, command: str, drafts: list[str], baselines: list[str], **more
):
    """The BenchRequest of one demo block at batch 1 on the demo's prompts and target."""
    from draftsmith.runtime.bench.run import BenchRequest

    return BenchRequest(
        target=cfg.target,
        drafts=drafts,
        prompts=cfg.prompt_set,
        num_prompts=cfg.num_prompts,
        max_new_tokens=cfg.max_new_tokens,
        temperatures=[cfg.temperature],
        batch_sizes=[1],
        baselines=baselines,
        repeats=cfg.repeats,
        out=str(folder),
        device=cfg.device,
        dtype=cfg.dtype,
        cpu_linears=cfg.cpu_linears,
        command=command,
        **more,
    )


def bench_head(cfg: DemoConfig, head: Path, target, folder: Path, command: str) -> dict:
    """Step 3: `draftsmith bench` at batch 1: plain + the configured baselines and DRAFT@TREE methods."""
    from draftsmith.runtime.bench.run import run_bench

    methods = [m.replace("{head}", str(head)) for m in cfg.methods]
    log.info("demo 3/4: bench on %d held-out %s prompts, %d new tokens", cfg.num_prompts, cfg.prompt_set,
             cfg.max_new_tokens)  # fmt: skip
    drafts = [m for m in methods if not is_baseline(m)]
    baselines = ["plain", *[m for m in methods if is_baseline(m) and m != "plain"]]
    return run_bench(bench_request(cfg, folder, command, drafts, baselines), target=target)


def bench_quantized(cfg: DemoConfig, head: Path, target, folder: Path, command: str):
    """Step 3, where verification is cheap: the target loaded again and quantized to `quantized`, its plain
    decoding against `quantized_methods` on the same prompts, interleaved -> (rows, the quantized target);
    None when `quantized` is none or the device has no kernel for it (a GPU: int4/int8 are CPU kernels)."""
    from draftsmith.runtime.bench.run import run_bench
    from draftsmith.runtime.core.target import Target

    spec = parse_quantize(cfg.quantized, None, "quantized")
    if spec is None:
        return None
    try:
        check_device(spec, target.device, "quantized")
    except BadInputError as err:
        log.warning("demo 3/4: no rows on a quantized target: %s", err)
        return None
    methods = [m.replace("{head}", str(head)) for m in cfg.quantized_methods]
    log.info("demo 3/4: the same prompts on the target quantized to %s: plain vs %s (the target loads again)",
             cfg.quantized, ", ".join(methods))  # fmt: skip
    qtarget = Target.load(cfg.target, device=cfg.device, dtype=cfg.dtype)
    request = bench_request(
        cfg, folder, command, methods, ["plain"], plots=False, roofline=False, quantize=cfg.quantized
    )
    print(f"\nThe target quantized to {cfg.quantized} (weight-only): speedups over its own plain decoding")
    with renamed_fields(QUANTIZED_FIELDS):
        return run_bench(request, target=qtarget)["rows"], qtarget


def weights_label(target) -> str:
    """fp32, bf16, ... or the quantization (int4-g64): what a block's rows ran on."""
    dtype = str(target.dtype).removeprefix("torch.")
    return target.quantization or {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def verify_curve(target, methods: list[str]) -> list[float]:
    """The target's verify-cost curve, ms of one forward over n = 1, 2, ... tokens at batch 1, up to the
    largest tree the methods verify: the bench's own measurement (what `auto:K` measures at start-up)."""
    from draftsmith.runtime.speculator import verify_costs

    nodes = min(max([verified_tokens(m) or 1 for m in methods] + [2]), 16)
    return [round(1000 * s, 2) for s in verify_costs(target, [1], nodes).seconds[1]]


def summary_markdown(command: str, blocks: list[Block], sentences: list[str]) -> str:
    """out_dir/summary.md: the rows of every target side by side, their verify-cost curves, the reading."""
    return "\n".join(
        [
            "# draftsmith demo: what the rows say",
            "",
            f"`{command}`; batch 1; each speedup over the same target's plain decoding, in this run.",
            "",
            side_by_side(blocks),
            "",
            "Verify-cost curve (one target forward over n tokens after a 128-token prefix, batch 1):",
            "",
            curve_table(blocks),
            "",
            "## Reading",
            "",
            *[f"- {s}" for s in sentences],
            "",
        ]
    )


def print_reading(blocks: list[Block], sentences: list[str], path: Path) -> None:
    """The demo's last lines: the rows side by side and the reading."""
    print("\nWhat this demo measured (batch 1; each speedup over the same target's plain decoding):")
    print(side_by_side(blocks))
    print(f"\nWhat the rows say (also in {path}):")
    for sentence in sentences:
        print(textwrap.fill(sentence, width=110, initial_indent="- ", subsequent_indent="  "))


def export_head(cfg: DemoConfig, head: Path, bench: Path, out: Path) -> list[str]:
    """Step 4: the head in each export format, its model card quoting this run's bench rows."""
    from draftsmith.train.export import ExportRequest, export

    folders = []
    for fmt in cfg.export_formats:
        request = ExportRequest(str(head), fmt, str(out / f"export-{fmt}"), bench=str(bench), overwrite=True)
        folders.append(str(export(request)))
    log.info("demo 4/4: exported %s", ", ".join(folders) or "nothing (export_formats is empty)")
    return folders
