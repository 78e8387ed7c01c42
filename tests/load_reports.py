"""transformers' LOAD REPORT warnings (missing / unexpected / mismatched keys) of a `from_pretrained`, for the
tests that load our speculators exports with speculators' own classes.

    with load_reports() as reports:
        model = SomeDraftModel.from_pretrained(folder)
    assert not reports
"""

import logging
from contextlib import contextmanager


@contextmanager
def load_reports():
    """Collects the LOAD REPORT messages transformers logs while the block runs."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addHandler(handler)
    reports: list[str] = []
    try:
        yield reports
    finally:
        logger.removeHandler(handler)
        reports += [m for m in messages if "LOAD REPORT" in m]
