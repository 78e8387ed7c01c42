"""Prompt files for `generate --prompts FILE`: one prompt per line, or JSON Lines with a "prompt" field.

Blank lines are skipped. A file that is not UTF-8 or has no prompt, a JSONL row without a string "prompt",
or a line that is not valid JSON in a JSONL file are `BadInputError`s naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.runtime.errors import BadInputError, read_text


def read_prompts_file(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise BadInputError("--prompts", str(path), "an existing file (one prompt per line, or JSONL)")
    lines = [(n, line) for n, line in enumerate(read_text(path, "--prompts").splitlines(), 1) if line.strip()]
    if not lines:
        raise BadInputError("--prompts", str(path), "a file with at least one prompt", "the file is empty")
    is_jsonl = path.suffix == ".jsonl" or all(line.lstrip().startswith("{") for _, line in lines)
    if not is_jsonl:
        return [line for _, line in lines]
    prompts = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BadInputError(f"--prompts {path}:{n}", line[:60], "a JSON object", str(err)) from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise BadInputError(f"--prompts {path}:{n}", line[:60], 'an object with a string "prompt" field')
        prompts.append(row["prompt"])
    return prompts
