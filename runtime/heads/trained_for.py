"""What a head was trained for, recorded in its config.json and checked where it is served: the target's
tokenizer, chat template (hash) and thinking mode of the data it learned from.

    stamp(final, trained_for(data_fingerprint))           # training (final/config.json); export copies it
    record = read_trained_for(folder)                     # None: no record
    check_drafts(["eagle3:DIR"], target, chat=True)        # generate, bench, eval: exit 2 on a mismatch

The record is one `trained_for` block at the top level of config.json: {"target", "tokenizer_hash",
"template_hash", "thinking"} (thinking "on" / "off", or None for a template without the mode:
runtime/core/chat_template.py). Our head folders and every export carry it; engines' config readers
ignore a key they do not know (tests/train/test_trained_for.py loads an export with speculators).

`check_drafts` compares each `--draft KIND:DIR`'s record with the target being served: another tokenizer is
exit 2 always (the head reads other token ids); another template hash or thinking mode is exit 2 naming
both sides, or with `allow` a warning printed once per head. With `--no-chat` nothing is rendered, so only
the tokenizer is checked. Heads without a record (trained before it existed, or by another trainer),
drafts without a head (ngram, self:, model:) and Hub ids not yet in the local Hub cache are not checked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftsmith.runtime.core.artifacts import tokenizer_hash
from draftsmith.runtime.core.chat_template import MODES, chat_identity, describe
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, TRAINED_FOR

log = logging.getLogger("draftsmith")
FIELDS = ("target", "tokenizer_hash", "template_hash", "thinking")
OVERRIDE = "--allow-template-mismatch"


def trained_for(fingerprint: dict) -> dict:
    """A data step's fingerprint (data_recipes/common.py) -> the head's record (no thinking key: None)."""
    return {key: fingerprint.get(key) for key in FIELDS}


def stamp(folder: str | Path, record: dict) -> None:
    """Add the record to `folder`'s config.json (rewritten atomically)."""
    path = Path(folder) / CONFIG_FILE
    config = read_json(path, "head config")
    config[TRAINED_FOR] = check_record(record, str(path))
    atomic_write_text(path, json.dumps(config, indent=1) + "\n")


def check_record(record, where: str) -> dict:
    """A record as written: an object with the four fields, string hashes, thinking on / off / null."""
    if not isinstance(record, dict) or sorted(record) != sorted(FIELDS):
        got = sorted(record) if isinstance(record, dict) else record
        raise BadInputError(f"{where} {TRAINED_FOR}", got, f"an object with exactly {list(FIELDS)}")
    for key in ("tokenizer_hash", "template_hash"):
        if not isinstance(record[key], str):
            raise BadInputError(f"{where} {TRAINED_FOR}.{key}", record[key], "a hash (string)")
    if record["thinking"] not in (None, *MODES):
        raise BadInputError(f"{where} {TRAINED_FOR}.thinking", record["thinking"], "on, off or null")
    return record


def record_in(config: dict, where: str) -> dict | None:
    """The record in a config.json's contents; None where it has none."""
    found = config.get(TRAINED_FOR)
    return None if found is None else check_record(found, where)


def read_trained_for(folder: str | Path) -> dict | None:
    """The record in `folder`'s config.json; None without a config.json or without a record."""
    path = Path(folder) / CONFIG_FILE
    return record_in(read_json(path, "head config"), str(path)) if path.is_file() else None


def check_trained_for(record: dict, target, what: str, allow: bool = False, chat: bool = True) -> str | None:
    """Exit 2 where `record` does not fit `target` as it renders prompts now; with `allow`, a template or
    thinking-mode mismatch comes back as the warning's text instead."""
    served = tokenizer_hash(target.tokenizer)
    if record["tokenizer_hash"] != served:
        raise BadInputError(
            what,
            f"a head trained for {record['target']} (tokenizer {record['tokenizer_hash']})",
            f"a head for {target.name} (tokenizer {served})",
            "serve it with the target it was trained for",
        )
    trained, renders = {k: record[k] for k in ("template_hash", "thinking")}, chat_identity(target)
    if not chat or trained == renders:
        return None
    said = f"head trained with {describe(trained)}; {target.name} renders {describe(renders)}"
    if allow:
        return f"{what}: {said} ({OVERRIDE}: acceptance usually drops)"
    fix = (
        "--thinking " + trained["thinking"] if trained["template_hash"] == renders["template_hash"] else None
    )
    raise BadInputError(
        what,
        f"a head trained with {describe(trained)}",
        f"a head for {target.name}'s {describe(renders)}",
        f"{said}: serve it {'with ' + fix if fix else 'with the target it was trained for'}, "
        f"or pass {OVERRIDE} to run it anyway",
    )


def check_drafts(specs: list[str], target, allow: bool = False, chat: bool = True) -> None:
    """`check_trained_for` for each `--draft` spec (DRAFT@TREE too) that names a head with a record; with
    `allow`, each mismatching head's warning once."""
    warned = set()
    for spec in specs:
        draft = spec.partition("@")[0]
        folder = head_folder_of(draft)
        record = _served_record(folder) if folder is not None else None
        if record is None:
            continue
        warning = check_trained_for(record, target, f"--draft {draft}", allow, chat)
        if warning and folder.resolve() not in warned:
            warned.add(folder.resolve())
            log.warning("%s", warning)


def _served_record(folder: Path) -> dict | None:
    """The record of a head about to load; a config.json that is not JSON is left to the kind's loader,
    whose error names the head."""
    path = folder / CONFIG_FILE
    try:
        config = read_json(path, "head config") if path.is_file() else {}
    except BadInputError:
        return None
    return record_in(config, str(path))


def head_folder_of(draft: str) -> Path | None:
    """The local folder a `--draft KIND:DIR` reads (a Hub id: its snapshot in the local Hub cache, if
    any); None for a draft without a head (ngram, self:..., model:...)."""
    from draftsmith.runtime.heads import head_kinds

    found = head_kinds.draft_kind(draft)
    if found is None:
        return None
    kind, arg = found
    path = kind.draft_arg(arg)[0].partition("#")[0]
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    return _cached_snapshot(path)


def _cached_snapshot(repo_id: str) -> Path | None:
    """A Hub id's config.json already in the local cache (no network): its folder, else None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, CONFIG_FILE)
    except ValueError:  # not a repo id
        return None
    return Path(found).parent if isinstance(found, str) else None
