"""Fixtures of the data-recipe tests: the data steps' `--engine auto` sees no vLLM unless a test says so
(tests/vllm_free.py); test_engine_choice.py points the lookup at its own fake interpreters."""

from vllm_free import no_vllm_by_default  # noqa: F401 (a fixture: importing it registers it here)
