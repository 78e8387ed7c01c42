"""Strict config loading: dataclasses are the schema, YAML files are partial instances, `a.b=value` overrides.

    cfg = load_config(DemoConfig, "configs/demo.yaml", ["max_new_tokens=32", "sampling.temperature=0.7"])
    save_config(cfg, "runs/demo/config.yaml")      # the resolved config, written atomically

Unknown keys and values of the wrong type are `BadInputError`s naming the dotted key. Values are coerced
by annotation because PyYAML is YAML 1.1: `lr: 1e-4` loads as the string '1e-4' and must become a float.
Supported field types: int, float, bool, str, Path, Literal, X | None, list[X], tuple[X, ...], dataclasses.
A field whose metadata has `section=f` is the dataclass `f(value, dotted_key)` picks for its value.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from draftsmith.runtime.errors import BadInputError

C = TypeVar("C")
YAML_BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | tuple = ()) -> C:
    """Build `cls` from an optional YAML file and `a.b=value` overrides (later wins)."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_yaml(path)
    for item in overrides:
        apply_override(data, item)
    return from_dict(cls, data)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise BadInputError("--config", str(path), "an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise BadInputError("--config", str(path), "valid YAML", hint=str(err).splitlines()[0]) from None
    if data is None:  # more often a wrong or unwritten file than "every default" (a long run on defaults)
        why = "the file is empty; write {} to take every default"
        raise BadInputError("--config", str(path), "a YAML mapping of settings", why)
    if not isinstance(data, dict):
        raise BadInputError("--config", str(path), "a YAML mapping at the top level")
    return data


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set `a.b.c=value` in a nested dict; the value is parsed as YAML (so `[1, 2]` is a list)."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise BadInputError("override", item, "key=value with a dotted key, e.g. train.max_steps=10")
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise BadInputError(key, item, f"'{part}' to be a section, but it holds a value")
        node = child
    try:
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        node[leaf] = raw


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Strictly build dataclass `cls` from a (partial) dict; missing keys keep their defaults."""
    if not isinstance(data, dict):
        raise BadInputError(prefix.rstrip(".") or "config", data, "a mapping of keys to values")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else None
            raise BadInputError(f"{prefix}{key}", data[key], f"one of the keys {sorted(fields)}", hint)
    kwargs = {}
    for key, value in data.items():
        # a section whose class depends on its contents (a train config's `head:` by its `type`)
        select = fields[key].metadata.get("section")
        tp = select(value, f"{prefix}{key}") if select else hints[key]
        kwargs[key] = _coerce(tp, value, f"{prefix}{key}")
    try:
        obj = cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise BadInputError(prefix.rstrip(".") or "config", data, f"all required keys ({err})") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except BadInputError as err:
                errors.append(err.expected)
        raise BadInputError(key, value, " or ".join(errors))
    if origin is typing.Literal:
        if isinstance(value, bool):  # YAML 1.1 reads no/off/yes/on as booleans: take them back as words
            value = next((w for w in YAML_BOOL_WORDS[value] if w in args), value)
        if value not in args:
            raise BadInputError(key, value, f"one of {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise BadInputError(key, value, f"a list ({tp})")
        item_tp = args[0] if args else Any
        items = [_coerce(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise BadInputError(key, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise BadInputError(key, value, "an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 reads 1e-4 as a string
            except ValueError:
                pass
        raise BadInputError(key, value, "a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise BadInputError(key, value, "a string")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise BadInputError(key, value, "a path")
    raise TypeError(f"config field {key} has an unsupported type {tp}")


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain YAML-able dict (Paths become strings, tuples lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def save_config(obj: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically (a killed run never leaves half a file)."""
    atomic_write_text(Path(path), yaml.safe_dump(to_dict(obj), sort_keys=False))


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; configs and records are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
