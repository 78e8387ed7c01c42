"""Every YAML shipped under configs/ loads strictly into its schema (torchtune's test_configs idea)."""

from pathlib import Path

import pytest

from draftsmith.runtime.cli.demo import DemoConfig
from draftsmith.runtime.core.config import load_config
from draftsmith.train.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# File-name prefix -> schema. A new kind of config must be registered here, so none goes untested.
SCHEMAS = {
    "demo-": DemoConfig,
    "eagle3-": TrainConfig,
    "mtp-": TrainConfig,
    "medusa-": TrainConfig,
    "medusa2-": TrainConfig,
    "peagle-": TrainConfig,
    "dflash-": TrainConfig,
    "dspark-": TrainConfig,
}


def schema_for(path: Path):
    for prefix, schema in SCHEMAS.items():
        if path.name.startswith(prefix):
            return schema
    raise AssertionError(f"{path.name}: no schema registered in tests/test_configs.py")


YAMLS = sorted(CONFIGS.glob("*.yaml"))


def test_configs_exist():
    assert YAMLS, "configs/ ships no YAML"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_config_loads(path):
    cfg = load_config(schema_for(path), path)
    assert isinstance(cfg, schema_for(path))


def test_demo_config_rejects_bad_values():
    from draftsmith.runtime.errors import BadInputError

    with pytest.raises(BadInputError, match="repeats"):
        load_config(DemoConfig, CONFIGS / "demo-smollm2-135m.yaml", ["repeats=0"])
    with pytest.raises(BadInputError, match="prompts"):
        load_config(DemoConfig, None, ["prompts=[]"])
