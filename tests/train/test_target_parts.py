"""Offline training with only the target's parts (runtime/core/target_parts.py) on a tiny random Llama saved
as
three safetensors shards plus an index: the parts equal the whole target's tensors and are all it holds;
offline EAGLE-3 and MTP runs with the parts equal the same runs with the whole target bit for bit (and
the MTP head binds to the same weights hash); a broken checkpoint is refused naming the file or tensor.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/train/test_target_parts.py -q
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import tiny_config, tiny_model, tiny_tokenizer
from train_data import read_metrics, run_overrides
from transformers import AutoModelForCausalLM

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.artifacts import weights_hash
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.core.target_parts import INDEX_FILE, PartsOnlyError, TargetParts
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config
from draftsmith.runtime.heads.mtp import MtpConfig, load_head
from draftsmith.train.config import load_train_config
from draftsmith.train.loop import trainer as trainer_module
from draftsmith.train.loop.checkpoints import finished_checkpoints
from draftsmith.train.loop.trainer import Trainer

PARTS = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def save_sharded(model, folder):
    """save_pretrained in three shards (embed_tokens in the first; norm and lm_head in the last)."""
    model.save_pretrained(folder, max_shard_size="200KB")
    tiny_tokenizer().save_pretrained(folder)
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    assert sorted(set(weight_map.values())) == SHARDS
    return folder


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    return save_sharded(tiny_model(), tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    """SmolLM2's layout: tie_word_embeddings, so the checkpoint holds no lm_head.weight."""
    config = tiny_config()
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    folder = save_sharded(AutoModelForCausalLM.from_config(config).eval(), tmp_path_factory.mktemp("tied"))
    assert "lm_head.weight" not in json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    return folder


# ---- the parts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("which", ["untied", "tied"])
def test_parts_equal_the_whole_targets_and_are_all_it_holds(sharded_dir, tied_dir, which, dtype):
    folder = sharded_dir if which == "untied" else tied_dir
    parts = TargetParts.load(str(folder), device="cpu", dtype=dtype)
    whole = Target.load(str(folder), device="cpu", dtype=dtype)
    held = dict(parts.model.named_parameters())
    expected = PARTS if which == "untied" else PARTS - {"lm_head.weight"}
    assert set(held) == expected and len(list(parts.model.parameters())) == len(expected)
    assert list(parts.model.buffers()) == []
    assert parts.read_files == [SHARDS[0], SHARDS[2]]  # the middle shard (layers only) never opened
    full = dict(whole.model.named_parameters())
    for name, tensor in held.items():
        assert tensor.dtype == full[name].dtype and torch.equal(tensor, full[name])
    assert torch.equal(parts.model.lm_head.weight, whole.model.lm_head.weight)
    if which == "tied":
        assert parts.model.lm_head.weight is parts.decoder.embed_tokens.weight
    # what offline batches and head construction read, value for value
    hidden = torch.randn(2, 5, 64).to(parts.dtype)
    ids = torch.randint(0, 128, (2, 5))
    assert torch.equal(parts.logits(hidden), whole.logits(hidden))
    assert torch.equal(parts.embed(ids), whole.embed(ids))
    assert torch.equal(parts.final_norm(hidden), whole.final_norm(hidden))
    facts = ("vocab_size", "hidden_size", "num_layers", "max_context", "dtype", "device", "name", "path")
    assert {k: getattr(parts, k) for k in facts} == {k: getattr(whole, k) for k in facts}
    assert asdict(Eagle3Config.for_target(parts, [0, 1, 2], 64)) == asdict(
        Eagle3Config.for_target(whole, [0, 1, 2], 64)
    )
    # the MTP identity and init: the hash and the last layer read from the checkpoint, in the dtype
    assert parts.weights_hash() == whole.weights_hash() == weights_hash(whole.model)
    assert asdict(MtpConfig.for_target(parts, 2)) == asdict(MtpConfig.for_target(whole, 2))
    last, expected_last = parts.layer_state(2), whole.layer_state(-1)
    assert sorted(last) == sorted(expected_last)
    assert all(torch.equal(last[k], expected_last[k]) for k in last)
    assert set(dict(parts.model.named_parameters())) == expected  # read, never kept
    with pytest.raises(PartsOnlyError, match="decoder layers"):
        parts.new_cache(1, 8)


def test_the_embedded_target_loads_its_parts_from_the_converted_folder(smollm2):
    """SmolLM2's GGUF is converted once to a safetensors folder (runtime/core/targets.py): the parts come from
    that same folder, 2 of its 272 tensors, and equal the whole target's."""
    parts = TargetParts.load("smollm2-135m", device="cpu", dtype="float32")
    assert parts.path == smollm2.path and parts.name == smollm2.name
    assert set(dict(parts.model.named_parameters())) == PARTS - {"lm_head.weight"}  # tied
    assert torch.equal(parts.model.lm_head.weight, smollm2.model.lm_head.weight)
    assert torch.equal(parts.decoder.norm.weight, smollm2.decoder.norm.weight)
    assert parts.weights_hash() == smollm2.weights_hash()
    assert parts.description().startswith("loaded 2 of 272 target tensors")


# ---- training runs -----------------------------------------------------------------------------------
def offline_config(folder, source, data_dir, out, *extra):
    overrides = run_overrides(folder, source, data_dir, out, "data.mode=offline", "train.max_steps=4", *extra)
    return load_train_config(None, overrides)


def whole_target(cfg, acc, whole=False):
    return Target.load(cfg.target, device=str(acc.device), dtype=cfg.dtype)


def run(cfg, whole: bool, monkeypatch) -> Trainer:
    """One run to the end; `whole`: with the whole target, as offline mode loaded it before parts."""
    with monkeypatch.context() as m:
        if whole:
            m.setattr(trainer_module, "load_target", whole_target)
        trainer = Trainer(cfg)
        trainer.fit()
    return trainer


def assert_same_run(a, b):
    for kind in ("train", "eval"):
        assert [r["loss"] for r in read_metrics(a, kind)] == [r["loss"] for r in read_metrics(b, kind)]
    head_a, head_b = (
        load_file(str(a / "final" / "model.safetensors")),
        load_file(str(b / "final" / "model.safetensors")),
    )
    assert sorted(head_a) == sorted(head_b)
    assert all(torch.equal(head_a[k], head_b[k]) for k in head_a)


@pytest.mark.parametrize(
    "head",
    [["train.ttt_steps=3"], ["head.type=mtp", "head.num_modules=2", "train.lr=0.002"]],
    ids=["eagle3", "mtp"],
)
def test_offline_with_parts_equals_offline_with_the_whole_target(
    sharded_dir, source, tmp_path, monkeypatch, caplog, head
):
    """The first run also makes the capture (the whole target is loaded for it alone, then dropped)."""
    data = tmp_path / "data"
    with caplog.at_level("INFO", logger="draftsmith"):
        parts_run = run(
            offline_config(sharded_dir, source, data, tmp_path / "parts", *head), False, monkeypatch
        )
    assert isinstance(parts_run.target, TargetParts)
    assert set(dict(parts_run.target.model.named_parameters())) == PARTS  # resident: the parts, no more
    assert "offline: loaded 3 of 30 target tensors (embed_tokens, norm, lm_head)" in caplog.text
    assert "loading it for the capture only" in caplog.text
    whole_run = run(offline_config(sharded_dir, source, data, tmp_path / "whole", *head), True, monkeypatch)
    assert isinstance(whole_run.target, Target)
    assert_same_run(tmp_path / "parts", tmp_path / "whole")
    if "head.type=mtp" in head:  # the identity check: the head binds to the whole target's weights
        whole = Target.load(str(sharded_dir), device="cpu")
        assert load_head(tmp_path / "parts" / "final").config.target_weights_hash == weights_hash(whole.model)
        load_head(tmp_path / "parts" / "final", target=whole)  # check_head_matches_target passes
    # With the capture made, an offline run never loads the whole target.
    with monkeypatch.context() as m:
        m.setattr(Target, "load", classmethod(lambda *a, **k: pytest.fail("the whole target was loaded")))
        assert isinstance(
            Trainer(offline_config(sharded_dir, source, data, tmp_path / "again", *head)).target, TargetParts
        )


# ---- broken checkpoints ------------------------------------------------------------------------------
def broken_copy(sharded_dir, tmp_path, edit):
    folder = tmp_path / "broken"
    shutil.copytree(sharded_dir, folder)
    index = json.loads((folder / INDEX_FILE).read_text())
    edit(folder, index["weight_map"])
    (folder / INDEX_FILE).write_text(json.dumps(index))
    return folder


BROKEN = {
    "a missing shard": (lambda f, w: (f / SHARDS[1]).unlink(), SHARDS[1]),
    "a tensor absent from the index": (
        lambda f, w: w.pop("model.norm.weight"),
        "without tensor model.norm.weight",
    ),
    "an index naming the wrong shard": (
        lambda f, w: w.update({"lm_head.weight": SHARDS[0]}),
        f"{SHARDS[0]} without tensor lm_head.weight",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_checkpoint_is_refused_naming_the_file_or_tensor(
    sharded_dir, source, tmp_path, capsys, case
):
    edit, named = BROKEN[case]
    folder = broken_copy(sharded_dir, tmp_path, edit)
    with pytest.raises(BadInputError, match=named):
        TargetParts.load(str(folder), device="cpu")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("{}\n")
    argv = run_overrides(folder, source, tmp_path / "data", tmp_path / "out", "data.mode=offline")
    assert main(["train", "--config", str(cfg), *argv]) == 2
    err = capsys.readouterr().err
    assert "target: got" in err and named in err


# ---- the same on two gloo processes ------------------------------------------------------------------
LAUNCH = '''"""draftsmith.train recording each rank's resident target parameters and whole-target loads; with
WHOLE=1, offline loads the whole target (as before TargetParts)."""
import json, os, sys
from pathlib import Path
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.train.loop import trainer

loads, load = [], Target.load.__func__
Target.load = classmethod(lambda cls, *a, **k: loads.append(a) or load(cls, *a, **k))
if os.environ["WHOLE"] == "1":
    trainer.load_target = lambda cfg, acc, whole=False: Target.load(cfg.target, str(acc.device), cfg.dtype)
init = trainer.Trainer.__init__


def recording(self, cfg):
    init(self, cfg)
    names = sorted(n for n, _ in self.target.model.named_parameters())
    record = {"type": type(self.target).__name__, "params": names, "whole_loads": len(loads)}
    (Path(os.environ["RECORD"]) / f"rank-{self.acc.process_index}.json").write_text(json.dumps(record))


trainer.Trainer.__init__ = recording
code = main(["train", *sys.argv[1:]])
sys.stdout.flush(), sys.stderr.flush()
os._exit(code)
'''


@pytest.mark.distributed
def test_two_gloo_processes_offline_with_parts_equal_the_whole_target(sharded_dir, source, tmp_path):
    """DDP over gloo, 2 processes: each rank captures its part with the whole target, loaded for that
    alone, then holds only the parts; the run equals the same run with the whole target on each rank."""
    configs = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
    script, cfg = tmp_path / "launch.py", tmp_path / "cfg.yaml"
    script.write_text(LAUNCH)
    cfg.write_text("{}\n")
    extra = ["train.ttt_steps=3", "train.warmup_steps=0"]
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    records = {}
    for name, whole in (("parts", "0"), ("whole", "1")):
        (tmp_path / f"{name}-record").mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
        env.update(WHOLE=whole, RECORD=str(tmp_path / f"{name}-record"))
        overrides = run_overrides(
            sharded_dir, source, tmp_path / "data", tmp_path / name, "data.mode=offline", "train.max_steps=4"
        )
        cmd = [accelerate, "launch", "--config_file", str(configs / "ddp-cpu.yaml"), str(script)]
        done = subprocess.run(
            [*cmd, "--config", str(cfg), *overrides, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records[name] = [
            json.loads((tmp_path / f"{name}-record" / f"rank-{r}.json").read_text()) for r in (0, 1)
        ]
    for rank in records["parts"]:
        assert rank == {"type": "TargetParts", "params": sorted(PARTS), "whole_loads": 1}
    assert [r["type"] for r in records["whole"]] == ["Target", "Target"]
    for name in records:  # both really ran as two processes
        state = finished_checkpoints(tmp_path / name)[-1] / "trainer_state.json"
        assert json.loads(state.read_text())["world_size"] == 2
    assert_same_run(tmp_path / "parts", tmp_path / "whole")
