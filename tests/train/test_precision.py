"""The precision a run trains in is explicit and the same for every strategy (DDP, FSDP, DeepSpeed).

Accelerate fills the shipped DeepSpeed JSONs' `"bf16": {"enabled": "auto"}` from the precision the
Accelerator is given; given none it reads ACCELERATE_MIXED_PRECISION, default "no", so ZeRO-2/3 runs on a
GPU trained in fp32 without a word. Run: pytest tests/train/test_precision.py
"""

import json
from pathlib import Path

import pytest
import yaml
from train_data import run_overrides

from draftsmith.runtime.errors import BadInputError
from draftsmith.train.config import load_train_config
from draftsmith.train.loop import accelerator_setup
from draftsmith.train.loop.accelerator_setup import deepspeed_precision, requested_precision
from draftsmith.train.loop.trainer import train

DEEPSPEED_JSONS = sorted((Path(__file__).parents[2] / "configs" / "deepspeed").glob("*.json"))


class RecordingAccelerator:
    """Stands in for accelerate.Accelerator (DeepSpeed needs a GPU and the deepspeed package): records
    the keyword arguments the trainer passes and applies their precision to a plugin built from a shipped
    JSON, exactly as AcceleratorState does (`deepspeed_plugin.set_mixed_precision(mixed_precision)`)."""

    json_path: Path = DEEPSPEED_JSONS[0]
    seen: dict = {}

    def __init__(self, **kwargs):
        from accelerate.utils import DeepSpeedPlugin

        RecordingAccelerator.seen = kwargs
        plugin = DeepSpeedPlugin(hf_ds_config=str(self.json_path))
        # Accelerate's own default when no precision is passed (accelerate/state.py, AcceleratorState).
        plugin.set_mixed_precision(kwargs.get("mixed_precision") or "no")
        self.state = type("State", (), {"deepspeed_plugin": plugin})()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("ACCELERATE_MIXED_PRECISION", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")


def default_config(tmp_path, *overrides):
    return load_train_config(None, [f"output_dir={tmp_path}", *overrides])


@pytest.mark.parametrize("json_path", DEEPSPEED_JSONS, ids=lambda p: p.name)
def test_shipped_deepspeed_jsons_train_in_bf16_on_a_gpu_with_no_environment(
    json_path, clean_env, monkeypatch, tmp_path
):
    import accelerate

    monkeypatch.setattr(accelerator_setup.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(accelerate, "Accelerator", RecordingAccelerator)
    monkeypatch.setattr(RecordingAccelerator, "json_path", json_path)
    accelerator, precision = accelerator_setup.build_accelerator(default_config(tmp_path), None)
    assert RecordingAccelerator.seen["mixed_precision"] == "bf16"  # passed explicitly under DeepSpeed too
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    assert ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False
    assert precision == "bf16"


def test_an_explicit_precision_the_deepspeed_json_overrides_is_refused(clean_env, monkeypatch, tmp_path):
    import accelerate

    forced = tmp_path / "bf16-on.json"
    config = json.loads(DEEPSPEED_JSONS[0].read_text())
    config["bf16"] = {"enabled": True}
    forced.write_text(json.dumps(config))
    monkeypatch.setattr(accelerate, "Accelerator", RecordingAccelerator)
    monkeypatch.setattr(RecordingAccelerator, "json_path", forced)
    with pytest.raises(BadInputError) as err:
        accelerator_setup.build_accelerator(default_config(tmp_path, "train.mixed_precision=no"), None)
    assert err.value.field == "train.mixed_precision" and "bf16" in str(err.value)
    # With "auto" the JSON's explicit choice stands and is what the run reports.
    _, precision = accelerator_setup.build_accelerator(default_config(tmp_path), None)
    assert precision == "bf16"


def test_requested_precision_and_what_a_deepspeed_config_enables(tmp_path):
    cfg = default_config(tmp_path)
    assert requested_precision(cfg, cuda=True) == "bf16" and requested_precision(cfg, cuda=False) == "no"
    assert requested_precision(default_config(tmp_path, "train.mixed_precision=fp16"), cuda=False) == "fp16"
    assert deepspeed_precision({"bf16": {"enabled": "true"}, "fp16": {"enabled": False}}) == "bf16"
    assert deepspeed_precision({"fp16": {"enabled": True}}) == "fp16"
    assert deepspeed_precision({"bf16": {"enabled": "auto"}}) == "no"  # unfilled "auto" enables nothing


def test_a_run_logs_its_precision_and_records_it_in_config_yaml(tiny_dir, source, data_dir, tmp_path, caplog):
    out = tmp_path / "run"
    cfg = load_train_config(
        None, run_overrides(tiny_dir, source, data_dir, out, "train.ttt_steps=2", "train.max_steps=1")
    )
    with caplog.at_level("INFO", logger="draftsmith"):
        train(cfg)
    assert "training precision: fp32 (NO, 1 process(es))" in caplog.text  # a CPU run, one process
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["mixed_precision"] == "no"
