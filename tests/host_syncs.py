"""Counting host synchronizations: every way a tensor's values reach Python.

    with host_syncs() as counts:
        drafter.propose(contexts, tree)
    assert sum(counts.values()) == 0

On CUDA each of these waits for the device's queue to drain; on the CPU they are free, so a test here
counts the calls instead of timing them. Every tensor counts, host-built ones included, so the count is
an upper bound on the device's syncs.
"""

from collections import Counter
from contextlib import contextmanager

import torch

SYNCING = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")


@contextmanager
def host_syncs():
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING}

    def counted(name, method):
        def call(self, *args, **kwargs):
            counts[name] += 1
            return method(self, *args, **kwargs)

        return call

    try:
        for name, method in originals.items():
            setattr(torch.Tensor, name, counted(name, method))
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
