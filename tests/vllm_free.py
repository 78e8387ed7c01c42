"""A module-scoped autouse fixture that hides vLLM from the data steps' `--engine auto`.

auto picks vLLM wherever the lookup finds one (data_recipes/engine_choice.py), and a checkout may hold the
.venv-vllm that `make interop` builds: tests of draftsmith's own engine would then start vLLM (which also
refuses the tiny targets' 16-wide heads on a CPU). A conftest imports `no_vllm_by_default`; module scope,
so the module-scoped fixtures that run a data step see it too (an autouse fixture is set up first in its
scope; a function-scoped one would come after them). Tests that want a vLLM point the lookup at it.
"""

import pytest


@pytest.fixture(scope="module", autouse=True)
def no_vllm_by_default(tmp_path_factory):
    # an interpreter that does not exist (the env var wins over ./.venv-vllm; torchrun children inherit it)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTSMITH_VLLM_PYTHON", str(tmp_path_factory.getbasetemp() / "no-vllm" / "python"))
        yield
