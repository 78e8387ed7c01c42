"""draftsmith's log lines go to the stderr of the moment (runtime/cli/main.py CurrentStderr): a run whose
stderr was swapped out and closed (pytest's capture, a redirect) leaves nothing that writes to it later.

    python -m pytest tests/runtime/test_log_stream.py -q
"""

import io
import logging
import sys

from draftsmith.runtime.cli.main import setup_logging


def test_a_log_line_after_stderr_was_swapped_goes_to_the_new_stderr(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging(verbose=False)  # what every verb's main does first
    first.close()  # that run's stderr is gone, as pytest's capture of a finished test is
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("draftsmith.test").info("after the swap")
    assert second.getvalue() == "draftsmith: after the swap\n"
