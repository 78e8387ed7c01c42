"""Evaluation prompt sets, kept apart from training data: `sharegpt` (a held-out slice), `humaneval`,
MT-bench and Spec-Bench question files, and prompt files; and `sharegpt-train` (the training range, for
fitting a head's calibration on what it was trained on).

    prompts = load_prompt_set("sharegpt", 20)      # first user turns of held-out ShareGPT conversations
    prompts = load_prompt_set("humaneval", 20)     # HumanEval tasks, asked as chat instructions
    prompts = load_prompt_set("jsonl:FILE", 20)    # a prompts file (generate --prompts format)
    questions = load_bench_prompts("mtbench:question.jsonl", 80, categories=["coding", "math"])
    prompts = load_prompt_set("gsm8k:FILE", 20)    # an eval set (runtime/bench/eval_sets.py), bench and eval

`load_bench_prompts` returns `BenchPrompt`s: user turns plus a category. MT-bench's `question.jsonl` and
Spec-Bench's (`mtbench:FILE`, `specbench:FILE`) hold one object per line with `question_id`, `category`
and `turns` (a list of user messages); turn k is asked after the model's own answer to turn k-1, as
MT-bench does (the bench builds that conversation per method). `load_prompt_set` keeps first turns only.

The bundled ShareGPT file holds 17,671 complete conversations. Training recipes read from the start
(`data.max_samples`, at most SHAREGPT_HELD_OUT_START, in data_recipes.sources, for held-out claims); the
held-out slice is the conversations from index SHAREGPT_HELD_OUT_START on, so a benchmark prompt was
never seen in training. HumanEval is refused as a training source (data_recipes.sources).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from draftsmith.runtime.bench.bench_prompt import (  # noqa: F401 (BenchPrompt re-exported)
    HUMANEVAL_INSTRUCTION,
    BenchPrompt,
    humaneval_tasks,
)
from draftsmith.runtime.errors import BadInputError, read_text

MAX_PROMPT_CHARS = 2000  # long pastes make a CPU benchmark measure prefill, not decoding


PROMPT_SOURCES = (
    "sharegpt",
    "sharegpt-train",
    "humaneval",
    "mtbench:FILE",
    "specbench:FILE",
    "jsonl:FILE",
    "an eval set (docs/eval.md)",
)


def load_prompt_set(spec: str, num_prompts: int) -> list[str]:
    """First user turns of a prompt source (see load_bench_prompts)."""
    return [p.turns[0] for p in load_bench_prompts(spec, num_prompts)]


def load_bench_prompts(spec: str, num_prompts: int, categories: list[str] | None = None) -> list[BenchPrompt]:
    """The first `num_prompts` prompts of a source (after the category filter, when given)."""
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise BadInputError("--num-prompts", num_prompts, "an integer >= 1")
    kind, _, arg = spec.partition(":")
    from draftsmith.runtime.bench.eval_sets import is_eval_set, load_eval_set

    if is_eval_set(spec) and spec != "humaneval":  # the papers' sets (eval_sets.py): gsm8k, speed-bench, ...
        return load_eval_set(spec, num_prompts, categories)[0]
    if categories and kind not in ("mtbench", "specbench"):
        raise BadInputError("--categories", ",".join(categories), "no filter: only question files have them")
    if spec == "sharegpt":
        return [BenchPrompt((t,), id=f"sharegpt-{i}") for i, t in enumerate(sharegpt_held_out(num_prompts))]
    if spec == "sharegpt-train":
        return [
            BenchPrompt((t,), id=f"sharegpt-train-{i}") for i, t in enumerate(sharegpt_train(num_prompts))
        ]
    if spec == "humaneval":
        return [BenchPrompt((t,), "coding", f"humaneval-{i}") for i, t in enumerate(humaneval(num_prompts))]
    if kind == "jsonl" and arg:
        from draftsmith.runtime.core.prompts import read_prompts_file

        texts = read_prompts_file(arg)[:num_prompts]
        return [BenchPrompt((t,), id=f"line-{i}") for i, t in enumerate(texts)]
    if kind in ("mtbench", "specbench") and arg:
        questions = read_question_file(arg)
        if categories:
            known = sorted({q.category for q in questions})
            unknown = sorted(set(categories) - set(known))
            if unknown:
                raise BadInputError("--categories", ",".join(unknown), f"categories of {arg}: {known}")
            questions = [q for q in questions if q.category in categories]
        return questions[:num_prompts]
    raise BadInputError("--prompts", spec, " or ".join(PROMPT_SOURCES))


def read_question_file(path: str) -> list[BenchPrompt]:
    """MT-bench / Spec-Bench `question.jsonl`: `question_id`, `category`, `turns` (non-empty strings)."""
    file = Path(path)
    if not file.is_file():
        raise BadInputError("--prompts", path, "an existing question.jsonl file")
    questions = []
    for n, line in enumerate(read_text(file, "--prompts").splitlines(), 1):
        if not line.strip():
            continue
        where = f"--prompts {path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BadInputError(where, line[:60], "a JSON object", str(err)) from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if (
            not isinstance(turns, list)
            or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)
        ):
            raise BadInputError(f"{where} turns", str(turns)[:60], "a non-empty list of non-empty strings")
        if not isinstance(row.get("category", ""), str) or "question_id" not in row:
            raise BadInputError(where, line[:60], 'an object with "question_id", "category" and "turns"')
        questions.append(BenchPrompt(tuple(turns), row.get("category", ""), str(row["question_id"])))
    if not questions:
        raise BadInputError("--prompts", path, "a question file with at least one question")
    return questions


def sharegpt_held_out(num_prompts: int) -> list[str]:
    """First user turns of conversations SHAREGPT_HELD_OUT_START, +1, ... (skipping empty/too-long ones)."""
    from draftsmith.data_recipes.sources import SHAREGPT_HELD_OUT_START

    return sharegpt_first_turns(SHAREGPT_HELD_OUT_START, None, num_prompts, "held-out")


def sharegpt_train(num_prompts: int) -> list[str]:
    """First user turns of conversations 0, 1, ... (the training range, where recipes read: for fitting on
    what a head was trained on, e.g. `draftsmith calibrate`, never for a held-out claim)."""
    from draftsmith.data_recipes.sources import SHAREGPT_HELD_OUT_START

    return sharegpt_first_turns(0, SHAREGPT_HELD_OUT_START, num_prompts, "training-range")


def sharegpt_first_turns(start: int, stop: int | None, num_prompts: int, which: str) -> list[str]:
    from draftsmith.data_recipes.common import Summary
    from draftsmith.data_recipes.sources import iter_raw_rows, normalize

    prompts: list[str] = []
    rows = itertools.islice(iter_raw_rows("sharegpt"), start, stop)
    for row_id, row in rows:
        conv = normalize(row_id, row, Summary())
        first = next((m["content"] for m in conv.messages if m["role"] == "user"), "") if conv else ""
        if first.strip() and len(first) <= MAX_PROMPT_CHARS:
            prompts.append(first.strip())
        if len(prompts) == num_prompts:
            return prompts
    raise BadInputError("--num-prompts", num_prompts, f"at most {len(prompts)} {which} ShareGPT prompts")


def humaneval(num_prompts: int) -> list[str]:
    _, tasks = humaneval_tasks("--prompts")
    return [HUMANEVAL_INSTRUCTION.format(prompt=t["prompt"]) for t in tasks[:num_prompts]]
