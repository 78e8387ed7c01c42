"""Training data for tests: conversations in the tiny target's vocabulary (tests/tiny_models.py)."""

import json
import random
from pathlib import Path


def write_conversations(path: Path, n: int = 40, seed: int = 0) -> Path:
    """n two-turn conversations; answers count upwards (w5 w6 w7 ...), so a head has something to learn."""
    rng = random.Random(seed)
    with Path(path).open("w") as f:
        for _ in range(n):
            msgs = []
            for _ in range(2):
                ask = " ".join(f"w{rng.randrange(100)}" for _ in range(rng.randint(3, 8)))
                start = rng.randrange(100)
                answer = " ".join(f"w{(start + j) % 100}" for j in range(rng.randint(6, 16)))
                msgs += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    return Path(path)


def tiny_train_overrides(source: Path, data_dir: Path) -> list[str]:
    """Train-config overrides that fit the tiny target (3 layers, 128-token vocabulary) and its data."""
    return [
        f"data.source={source}",
        f"data.dir={data_dir}",
        "data.max_length=64",
        "data.validation_fraction=0.2",
        "head.aux_layers=0,1,2",
        "head.draft_vocab_size=64",
        "log.progress=false",
    ]


def run_overrides(tiny_dir, source: Path, data_dir: Path, out: Path, *extra: str) -> list[str]:
    """A 6-step run on the tiny target: evaluation every 3 steps, a checkpoint every 2, a row per step."""
    return [
        f"target={tiny_dir}",
        f"output_dir={out}",
        *tiny_train_overrides(source, data_dir),
        "train.max_steps=6",
        "train.batch_size=2",
        "train.warmup_steps=2",
        "eval.every=3",
        "eval.max_rows=4",
        "checkpoint.every=2",
        "log.every=1",
        *extra,
    ]


def read_metrics(out: Path, kind: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def online_and_offline_losses(make_config, train, tmp_path: Path) -> tuple[list[float], list[float]]:
    """Train 3 steps online and 3 steps offline (float32 capture shards); the per-step train losses."""
    runs = {"online": [], "offline": ["data.mode=offline", "data.storage_dtype=float32"]}
    for name, extra in runs.items():
        train(make_config(tmp_path / name, "train.max_steps=3", *extra))
    return tuple([r["loss"] for r in read_metrics(tmp_path / name)] for name in runs)
