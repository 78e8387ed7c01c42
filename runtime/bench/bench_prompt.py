"""What a prompt source yields (`BenchPrompt`: user turns, a category, an id) and how HumanEval is asked,
shared by bench's prompt sources (prompt_sets.py) and eval's sets (eval_sets.py) without either importing
the other at load."""

from __future__ import annotations

from dataclasses import dataclass

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with code only.\n\n```python\n{prompt}```"
)


@dataclass(frozen=True)
class BenchPrompt:
    turns: tuple[str, ...]  # user messages; turn k follows the model's own answer to turn k-1
    category: str = ""  # "" when the source has no categories
    id: str = ""
