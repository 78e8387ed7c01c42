"""The head-kind registry (runtime/heads/head_kinds.py, train/objectives/registry.py): what each kind
declares, the lookups that use it, and the rule that no other module tests a kind's name.

    python -m pytest tests/runtime/test_head_kinds.py -q
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.head_kind import HeadSection
from draftsmith.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
# A kind's own files may name it (its loader checks its head_type): runtime/NAME*.py, train/NAME_*.py, and
# EAGLE-3's engine layouts. The registries list the kinds. Everything else looks kinds up.
OWN = {"runtime/heads/layouts.py": "eagle3"}
REGISTRIES = {"runtime/heads/head_kinds.py", "runtime/drafters/registry.py", "train/objectives/registry.py"}


def test_every_kind_declares_a_module_section_drafter_layouts_and_objective():
    from draftsmith.runtime.drafters.registry import HEAD_DRAFTERS
    from draftsmith.train.objectives.registry import OBJECTIVES

    assert set(OBJECTIVES) == set(head_kinds.KINDS)  # the train side registers every kind's objective
    assert set(HEAD_DRAFTERS) == set(head_kinds.KINDS)  # and the drafters' side its drafter
    for name, kind in head_kinds.KINDS.items():
        assert kind.name == name and kind.title and kind.spec.startswith(f"{name}:")
        assert callable(kind.module.from_pretrained) and callable(kind.module.save_pretrained)
        assert issubclass(kind.section, HeadSection) and kind.section().type == name
        layouts = kind.all_layouts()
        assert "draftsmith" in layouts and all(
            callable(x.write) and callable(x.read) for x in layouts.values()
        )


def test_formats_map_each_layout_to_the_kinds_it_fits():
    assert head_kinds.formats() == {
        "draftsmith": ("eagle3", "mtp", "medusa", "peagle", "dflash", "dspark"),
        "eagle3": ("eagle3",),
        "gguf": ("eagle3",),
        "speculators": ("eagle3", "mtp", "peagle", "dflash", "dspark"),
        "mtp": ("mtp",),
        "mtp-mimo": ("mtp",),
        "medusa": ("medusa",),
        "vllm": ("peagle",),
        "dflash": ("dflash",),
    }


def test_export_help_lists_every_layout_of_the_registry(capsys):
    from draftsmith.runtime.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--help"])
    text = capsys.readouterr().out
    section = text[text.index("formats:") : text.index("examples:")]
    listed = [
        line.split()[0] for line in section.splitlines()[1:] if line.startswith("  ") and line[2] != " "
    ]
    assert listed == list(head_kinds.formats())  # each layout once, in registration order
    for name, kinds in head_kinds.formats().items():
        about = head_kinds.get(kinds[0]).all_layouts()[name].about
        assert about and about.split()[0] in section, name  # a layout without its line would fail here


def test_draft_help_lists_every_kind_of_the_registry(capsys):
    """`generate --help`'s --draft text is generated: the drafts without a head (named as
    runtime/drafters/drafting.py names them), then each kind's spec and its own words."""
    from draftsmith.runtime.cli.args import BASIC_DRAFTS
    from draftsmith.runtime.cli.main import build_parser
    from draftsmith.runtime.drafters.drafting import BASIC_SPECS

    assert tuple(BASIC_DRAFTS) == BASIC_SPECS
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines (and after hyphens)
    for kind in head_kinds.KINDS.values():
        assert kind.about and "".join(f"{kind.spec} ({kind.about})".split()) in text, kind.name
    assert "{drafts}" not in text and "model:TARGET(adraftLM" in text


def test_draft_specs_look_up_the_registry():
    kind, arg = head_kinds.draft_kind("mtp:runs/x/final#recursive")
    assert kind is head_kinds.KINDS["mtp"] and arg == "runs/x/final#recursive"
    assert head_kinds.draft_kind("eagle3:") is None and head_kinds.draft_kind("ngram") is None
    assert head_kinds.draft_kind("medusa2:DIR") is None  # not a registered kind
    assert head_kinds.default_depth("eagle3:DIR") == head_kinds.DEFAULT_DEPTH


def test_train_config_head_section_is_the_kinds_own():
    mtp = load_train_config(None, ["head.type=mtp", "head.num_modules=2"]).head
    assert type(mtp).__name__ == "MtpSection" and mtp.num_modules == 2
    eagle3 = load_train_config(None, []).head  # no head.type: the default kind
    assert type(eagle3) is head_kinds.KINDS[head_kinds.DEFAULT_KIND].section
    assert "num_modules" not in {f.name for f in fields(eagle3)}  # not a union of every kind's keys


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (["head.type=mtp", "head.num_layers=2"], "head.num_layers", "an option of head.type=eagle3"),
        (["head.num_modules=2"], "head.num_modules", "an option of head.type=mtp"),
        (["head.type=medusa9"], "head.type", "one of eagle3, mtp"),
        (["head.type=eagle3", "head.nonsense=1"], "head.nonsense", "one of the keys"),
    ],
)
def test_another_kinds_key_is_refused_naming_it(overrides, field, says):
    with pytest.raises(BadInputError) as err:
        load_train_config(None, overrides)
    assert err.value.field == field and says in str(err.value)


def test_cotraining_weights_are_the_kinds_own_head_keys():
    """Each co-training kind's head: section holds its own weight (a CotrainSection); no other has one."""
    from draftsmith.runtime.heads.head_kind import CotrainSection

    for kind in head_kinds.KINDS.values():
        assert kind.cotrain == issubclass(kind.section, CotrainSection), kind.name
    cfg = load_train_config(None, ["head.type=medusa", "head.cotrain_weight=0.5"])
    assert cfg.head.cotrain_weight == 0.5 and not hasattr(cfg.cotrain, "medusa_weight")
    assert load_train_config(None, ["head.type=mtp"]).head.cotrain_weight == 0.3


def test_old_cotrain_weights_load_into_their_new_place(caplog):
    """A config written before the move: the kind's old cotrain.KEY is read as its head.KEY with a warning;
    another kind's (a resolved config lists them all) is dropped; the old and new keys disagreeing is an
    error naming the old one."""
    old = ["cotrain.eagle3_weight=0.7", "cotrain.eagle3_detach_features=true", "cotrain.mtp_weight=0.3"]
    with caplog.at_level("WARNING", logger="draftsmith"):
        cfg = load_train_config(None, old)
    assert (cfg.head.cotrain_weight, cfg.head.cotrain_detach_features) == (0.7, True)
    assert "cotrain.eagle3_weight -> head.cotrain_weight" in caplog.text
    assert "ignored cotrain.mtp_weight (now head.cotrain_weight of head.type=mtp)" in caplog.text
    medusa = load_train_config(None, ["head.type=medusa", "cotrain.medusa_weight_schedule=linear"]).head
    assert medusa.cotrain_weight_schedule == "linear"
    with pytest.raises(BadInputError) as err:
        load_train_config(None, ["head.type=mtp", "head.cotrain_weight=0.2", "cotrain.mtp_weight=0.4"])
    assert err.value.field == "cotrain.mtp_weight" and "head.cotrain_weight" in str(err.value)
    shipped = ROOT / "heads" / "eagle3-smollm2-135m" / "train_config.yaml"  # written before the move
    assert load_train_config(shipped).head.cotrain_weight == 0.3


def test_cotraining_a_kind_that_does_not_allow_it_is_refused(monkeypatch):
    """Every shipped kind co-trains (EAGLE-3 too: train/objectives/eagle3_cotrain.py); a kind declaring
    cotrain=False is refused naming cotrain.enabled and the kinds that do."""
    from dataclasses import replace

    monkeypatch.setitem(head_kinds.KINDS, "eagle3", replace(head_kinds.KINDS["eagle3"], cotrain=False))
    with pytest.raises(BadInputError) as err:
        load_train_config(None, ["head.type=eagle3", "cotrain.enabled=true"])
    assert err.value.field == "cotrain.enabled" and "co-training is for mtp, medusa" in str(err.value)


def test_of_folder_reads_the_head_type(tmp_path):
    (tmp_path / "config.json").write_text('{"head_type": "mtp"}')
    assert head_kinds.of_folder(tmp_path) is head_kinds.KINDS["mtp"]
    (tmp_path / "config.json").write_text('{"head_type": "other"}')
    assert head_kinds.of_folder(tmp_path) is None and head_kinds.of_folder(tmp_path / "absent") is None


def kind_name_tests(path: Path, names: set[str]) -> list[int]:
    """Lines where a module compares with, indexes by or keys a dict on a head kind's name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                consts += [x.value for x in items if isinstance(x, ast.Constant)]
        elif isinstance(node, ast.Dict):
            consts = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            consts = [node.slice.value]
        if any(isinstance(c, str) and c in names for c in consts):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_a_kind_tests_a_kind_name(tmp_path):
    names = set(head_kinds.KINDS)
    bad = []
    for folder in ("runtime", "train", "data_recipes"):
        for path in sorted((ROOT / folder).rglob("*.py")):  # the sub-packages too
            rel = path.relative_to(ROOT).as_posix()
            own = {n for n in names if path.stem.startswith(n)} | ({OWN[rel]} if rel in OWN else set())
            if rel in REGISTRIES:
                continue
            lines = kind_name_tests(path, names - own)
            bad += [f"{rel}:{line}" for line in lines]
    assert not bad, (
        f"modules that switch on a head kind's name (look it up in runtime/heads/head_kinds.py): {bad}"
    )
    # the check itself finds the old switch sites
    probe = tmp_path / "probe.py"
    probe.write_text('HEAD_KINDS = {"eagle3": 1}\nif kind in ("eagle3", "mtp"): pass\nx = FORMATS["mtp"]\n')
    assert kind_name_tests(probe, names) == [1, 2, 3]
