"""Fixtures of the data-recipe tests: the data steps' `--engine auto` sees no vLLM unless a test says so.

auto picks vLLM wherever the lookup finds one (data_recipes/engine_choice.py), and a developer's checkout
may hold .venv-vllm: the default-engine tests here would then start vLLM. They stay on draftsmith's engine
on every machine; test_engine_choice.py points the lookup at its own fake interpreters.
"""

import pytest


@pytest.fixture(autouse=True)
def no_vllm_by_default(monkeypatch, tmp_path_factory):
    # an interpreter that does not exist (the env var wins over ./.venv-vllm; torchrun children inherit it)
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", str(tmp_path_factory.getbasetemp() / "no-vllm" / "python"))
