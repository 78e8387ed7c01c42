"""Fixtures of the training tests: a conversation file in the tiny vocabulary and a data folder per module;
the data steps they run stay on draftsmith's engine (tests/vllm_free.py)."""

import pytest
from train_data import write_conversations
from vllm_free import no_vllm_by_default  # noqa: F401 (a fixture: importing it registers it here)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_conversations(tmp_path_factory.mktemp("src") / "convs.jsonl")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")
