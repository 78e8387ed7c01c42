"""Errors users see. `BadInputError` means "you gave me something wrong" and maps to exit code 2.

Every message names the field, what it got and what it expected, so a user can fix the call without
reading a stack trace. `DraftsmithError` covers everything else we can explain (exit code 1).

The readers of user files live here too, so a bad file is refused the same way everywhere:
`read_text` (UTF-8), `read_json`, and `check_output_dir` / `check_output_file` for an output folder or file,
checked before the work (every verb's outputs: runtime/cli/args.py `declare_outputs`).

`Needs` / `check_needs`: an option that acts only in one mode (`--ssd-trace` with `--ssd`, `--group-size`
with `--quantize int4`, `data.storage_dtype` in offline training) is refused when set without it, naming
what it needs; each verb's table is checked once, right after parsing (runtime/cli/args.py `declare_needs`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DraftsmithError(Exception):
    """An error we can explain in one sentence (exit code 1)."""

    exit_code = 1


class BadInputError(DraftsmithError, ValueError):
    """Bad user input (exit code 2): names the field, the value it got and what it expected."""

    exit_code = 2

    def __init__(self, field: str, got: object, expected: str, hint: str | None = None):
        self.field, self.got, self.expected, self.hint = field, got, expected, hint
        message = f"{field}: got {got!r}, expected {expected}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


# ---- user files ---------------------------------------------------------------------------------------


def not_utf8(field: str, path: str | Path, err: UnicodeDecodeError, where: str = "") -> BadInputError:
    """The error for a text file that is not UTF-8 (`where`: " on line N" when known)."""
    byte = err.object[err.start : err.start + 1].hex()
    return BadInputError(
        field, str(path), "a UTF-8 text file", f"byte 0x{byte}{where} is not UTF-8; save the file as UTF-8"
    )


def read_text(path: str | Path, field: str) -> str:
    """A UTF-8 text file's contents; a file in another encoding is a `BadInputError` naming `field`."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise not_utf8(field, path, err, f" on line {line}") from None


def read_json(path: str | Path, field: str, kind: type | tuple[type, ...] = dict):
    """A JSON file's value, which must be a `kind` (an object by default); malformed JSON, another
    encoding or another kind of value is a `BadInputError` naming `field` and the place it breaks."""
    try:
        value = json.loads(read_text(path, field))
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}: {err.msg}"
        raise BadInputError(field, str(path), "a valid JSON file", where) from None
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join({dict: "an object", list: "a list"}.get(k, k.__name__) for k in kinds)
        raise BadInputError(
            field, str(path), f"a JSON file holding {names}", f"it holds {type(value).__name__}"
        )
    return value


def check_output_dir(field: str, path: str | Path) -> Path:
    """An output folder that can be created or reused: refused (before any work) when it, or a folder it
    would be created in, is an existing file."""
    path = Path(path).expanduser()
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "it is a file" if p == path else f"{p} is a file"
                raise BadInputError(field, str(path), "a folder (new or existing)", where)
            break
    return path


def check_output_file(field: str, path: str | Path) -> Path:
    """An output file that can be written (its folders are created as needed): refused (before any work)
    when it is an existing folder, or when a folder it would be written in is an existing file."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise BadInputError(field, str(path), "a file path (new or existing)", "it is a folder")
    for p in path.parents:
        if p.exists():
            if not p.is_dir():
                raise BadInputError(field, str(path), "a file path (new or existing)", f"{p} is a file")
            break
    return path


# ---- options that act only in one mode -------------------------------------------------------------------


@dataclass(frozen=True)
class Needs:
    """`field` acts only when `needs` holds: set without it, it is refused (exit 2) naming `needs`.

    `value` reads the field from what was parsed (argparse's namespace, a config); `unset` lists the values
    that mean "not set" (matched by type and value, so 0 is not False); `on` says whether the mode is chosen.
    """

    field: str  # as the user types it: --ssd-trace, data.storage_dtype
    needs: str  # the same: --ssd, data.mode=offline
    value: Callable[[Any], Any]
    on: Callable[[Any], bool]
    unset: tuple = (None, False)

    def is_set(self, value) -> bool:
        return not any(type(value) is type(u) and value == u for u in self.unset)


def flag_needs(flag: str, needs: str, on: Callable[[Any], bool], unset: tuple = (None, False)) -> Needs:
    """A `Needs` for a command-line flag, read from argparse's namespace under its dest."""
    dest = flag.lstrip("-").replace("-", "_")
    return Needs(flag, needs, lambda args: getattr(args, dest), on, unset)


def check_needs(parsed, rules) -> None:
    """Refuse the first option of `rules` that is set while the mode it needs is not."""
    for rule in rules:
        value = rule.value(parsed)
        if rule.is_set(value) and not rule.on(parsed):
            raise BadInputError(rule.field, value, f"{rule.needs} as well", "it has no effect without it")


# ---- the field the user set -----------------------------------------------------------------------------


@contextlib.contextmanager
def renamed_fields(names: dict[str, str], got=None):
    """Re-raise a `BadInputError` from code that names its own command-line flag under the field the user
    set here: `data.source` for `data prepare`'s `--source` in a train config, `--draft` for a draft model
    that fails to load as a `--target`. `names` maps flag -> field (a field "FLAG REST" keeps its REST, e.g.
    a line of the flag's file); `got` rewrites the value (e.g. "X" -> "model:X"). Other fields pass as is."""
    try:
        yield
    except BadInputError as err:
        flag, sep, rest = err.field.partition(" ")
        if flag not in names:
            raise
        value = err.got if got is None else got(err.got)
        raise BadInputError(names[flag] + sep + rest, value, err.expected, err.hint) from None
