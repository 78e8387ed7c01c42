"""Strict config loader: YAML + dotted overrides into dataclasses, errors naming the key."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from draftsmith.runtime.core.config import load_config, save_config
from draftsmith.runtime.errors import BadInputError


@dataclass
class Optim:
    lr: float = 1e-3
    betas: tuple[float, ...] = (0.9, 0.95)


@dataclass
class Run:
    name: str = "run"
    steps: int = 10
    mode: Literal["online", "offline"] = "online"
    resume: Path | None = None
    flag: bool = False
    layers: list[int] = field(default_factory=lambda: [1, 2])
    optim: Optim = field(default_factory=Optim)


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_coerce_by_annotation(tmp_path):
    path = write(tmp_path, "steps: 5\noptim:\n  lr: 1e-4\n")  # YAML 1.1 reads 1e-4 as a string
    cfg = load_config(Run, path, ["optim.betas=[0.8, 0.99]", "mode=offline", "resume=ckpt/3", "flag=true"])
    assert cfg.steps == 5 and cfg.optim.lr == pytest.approx(1e-4) and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.99)
    assert cfg.mode == "offline" and cfg.resume == Path("ckpt/3") and cfg.flag is True
    assert cfg.layers == [1, 2] and cfg.name == "run"


@pytest.mark.parametrize(
    "override, field_name, expected",
    [
        ("stepz=3", "stepz", "did you mean 'steps'"),
        ("optim.lrr=3", "optim.lrr", "did you mean 'optim.lr'"),
        ("steps=abc", "steps", "an integer"),
        ("steps=1.5", "steps", "an integer"),
        ("flag=maybe", "flag", "true or false"),
        ("mode=sideways", "mode", "['online', 'offline']"),
        ("layers=[1, x]", "layers[1]", "an integer"),
        ("optim=3", "optim", "mapping"),
        ("optim.lr=fast", "optim.lr", "a number"),
        ("noequals", "override", "key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, field_name, expected):
    with pytest.raises(BadInputError) as err:
        load_config(Run, None, [override])
    assert err.value.field == field_name
    assert expected in str(err.value)


def test_unknown_key_in_yaml_is_an_error(tmp_path):
    with pytest.raises(BadInputError, match="optim.momentum"):
        load_config(Run, write(tmp_path, "optim:\n  momentum: 0.9\n"))


def test_bad_files(tmp_path):
    with pytest.raises(BadInputError, match="an existing YAML file"):
        load_config(Run, tmp_path / "missing.yaml")
    with pytest.raises(BadInputError, match="mapping at the top level"):
        load_config(Run, write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(BadInputError, match="valid YAML"):
        load_config(Run, write(tmp_path, "a: [1, 2\n"))


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(Run, None, ["optim.lr=0.5", "resume=x/y", "layers=[3]"])
    out = tmp_path / "out" / "config.yaml"
    save_config(cfg, out)
    assert load_config(Run, out) == cfg
    assert yaml.safe_load(out.read_text())["resume"] == "x/y"
    assert [p.name for p in out.parent.iterdir()] == ["config.yaml"]  # no temp file left behind


@dataclass
class Precision:
    mixed: Literal["auto", "no", "bf16"] = "auto"
    switch: Literal["on", "off"] = "on"


def test_yaml_boolean_words_map_back_to_literal_choices(tmp_path):
    """YAML 1.1 reads `no`/`off` as False: a Literal that offers the word gets the word back."""
    cfg = load_config(Precision, write(tmp_path, "mixed: no\nswitch: off\n"))
    assert cfg.mixed == "no" and cfg.switch == "off"
    assert load_config(Precision, None, ["switch=on"]).switch == "on"
    with pytest.raises(BadInputError, match="mixed: got True"):  # no word for True among the choices
        load_config(Precision, None, ["mixed=yes"])
