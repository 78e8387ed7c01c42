"""What every data step shares: content hashes, the step record (`draftsmith_data.json`), drop counts.

    fp = fingerprint(target)                       # target name, tokenizer hash, template hash (+ thinking)
    record = StepRecord("prepare", inputs={...})   # inputs decide the content hash
    if is_done(out_dir, record): return            # same inputs, finished before: a no-op
    ... write the outputs ...
    finish(out_dir, record, summary)               # written last and atomically: marks the folder done

A folder whose record is missing or names other inputs is not done, so a killed step is detected and
redone (or resumed by the step's own mechanism). Hashes are sha256 over canonical JSON, shortened to 16
hex digits, and recorded so training can refuse data made for another target, tokenizer or template
(sgl-project/SpecForge#296: data and training rendered different chat templates).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from draftsmith.runtime.core.artifacts import (  # noqa: F401 (re-exported for the data steps)
    atomic_save_file,
    content_hash,
    template_hash,
    tokenizer_hash,
)
from draftsmith.runtime.core.chat_template import chat_identity
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.errors import BadInputError, check_output_dir, read_json

RECORD_FILE = "draftsmith_data.json"
FORMAT_VERSION = 1


def fingerprint(target) -> dict:
    """Identity of the target as far as data is concerned; `thinking` ("on"/"off", the mode rendered with:
    runtime/core/chat_template.py) only where the template has a thinking mode, so the hashes of data
    for other templates stay as they were."""
    found = {
        "target": target.name,
        "vocab_size": target.vocab_size,
        "tokenizer_hash": tokenizer_hash(target.tokenizer),
        "template_hash": template_hash(target.tokenizer),
    }
    mode = chat_identity(target)["thinking"]
    return found if mode is None else {**found, "thinking": mode}


def follow_thinking(target, record: dict) -> None:
    """Render with the thinking mode the data was made with (regenerate and capture follow prepare's
    `--thinking`); data without a recorded mode: the template's default."""
    mode = record["inputs"].get("fingerprint", {}).get("thinking")
    target.thinking = None if mode is None else mode == "on"


@dataclass
class Summary:
    """Rows read, kept and dropped by reason; printed at the end of every step."""

    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    notes: Counter = field(default_factory=Counter)  # counted but kept, e.g. "clipped mid-answer"

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def as_dict(self) -> dict:
        """Every field in order, counters as plain dicts (not dataclasses.asdict: it rebuilds a Counter from
        (key, value) pairs, counting the pairs)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: dict(v) if isinstance(v, Counter) else v for name, v in values.items()}

    def lines(self) -> list[str]:
        out = [f"read {self.read}, kept {self.kept}, dropped {sum(self.dropped.values())}"]
        out += [f"  dropped ({reason}): {n}" for reason, n in sorted(self.dropped.items())]
        out += [f"  {note}: {n}" for note, n in sorted(self.notes.items())]
        return out


@dataclass
class StepRecord:
    step: str  # prepare | regenerate | capture | vocab
    inputs: dict  # everything that decides the outputs (fingerprint, source hash, options)
    outputs: dict = field(default_factory=dict)  # filled by the step (files, counts, metadata)

    @property
    def inputs_hash(self) -> str:
        return content_hash({"step": self.step, "inputs": self.inputs})


def read_record(folder: str | Path, field_name: str = "data folder") -> dict | None:
    """The folder's record, None when it has none; a damaged one is a `BadInputError` naming the flag."""
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return None
    return read_json(path, field_name)


def is_done(folder: str | Path, record: StepRecord) -> bool:
    """True when `folder` holds a finished step with exactly these inputs (re-running is a no-op)."""
    done = read_record(folder, "--out")
    return bool(done) and done.get("inputs_hash") == record.inputs_hash


def finish(folder: str | Path, record: StepRecord, summary: Summary | None = None) -> dict:
    """Write the record last, atomically: from now on the folder counts as done."""
    data = {
        "format": "draftsmith-data",
        "version": FORMAT_VERSION,
        **asdict(record),
        "inputs_hash": record.inputs_hash,
        "summary": summary.as_dict() if summary else None,
    }
    atomic_write_text(Path(folder) / RECORD_FILE, json.dumps(data, indent=1) + "\n")
    return data


def require_record(folder: str | Path, field_name: str, steps: tuple[str, ...]) -> dict:
    """The record of a finished step in `folder`, or a clear error naming the flag."""
    done = read_record(folder, field_name)
    if done is None:
        raise BadInputError(
            field_name, str(folder), f"a finished draftsmith data folder ({RECORD_FILE} missing)"
        )
    if done.get("step") not in steps:
        raise BadInputError(
            field_name, f"{folder} (a {done.get('step')} folder)", f"the output of {' or '.join(steps)}"
        )
    return done


def check_same_target(record: dict, target, field_name: str) -> None:
    """Refuse data made for another target, tokenizer, chat template or thinking mode (the recorded hashes
    differ)."""
    expected = fingerprint(target)
    made_for = record["inputs"].get("fingerprint", {})
    for key in ("tokenizer_hash", "template_hash", "vocab_size", "thinking"):
        if key == "thinking" and made_for.get(key) is None:  # older data, or a template without the mode
            continue
        if made_for.get(key) != expected.get(key):
            again = "with the same thinking mode" if key == "thinking" else "for this target"
            raise BadInputError(
                field_name,
                f"data made with {key} {made_for.get(key)} (target {made_for.get('target')})",
                f"{key} {expected.get(key)} of {target.name}",
                f"prepare the data again {again}",
            )


def guard_out_dir(out: Path, data_dir: Path, step: str) -> None:
    """Refuse to write a step's output over its input, over another step's folder, or where a file is."""
    check_output_dir("--out", out)
    if out.resolve() == data_dir.resolve():
        raise BadInputError("--out", str(out), "a folder other than --data (the input would be overwritten)")
    done = read_record(out, "--out")
    if done is not None and done.get("step") != step:
        raise BadInputError(
            "--out",
            f"{out} (holds a finished {done.get('step')} step)",
            f"an empty folder or an earlier {step} output",
        )
