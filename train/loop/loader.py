"""Micro-batch rows read ahead of the training step: a DataLoader over the sample order.

`SampleOrder` fixes which rows micro-batch (step, micro) reads as a pure function of the step, so the
loader only has to read those rows in that order: item i is micro-batch i counted from the step the run
starts (or resumes) at. Workers (`train.loader_workers`) read rows (prepared token ids, or capture shards
offline) while the step computes; the batch itself (padding, the frozen target's forward online) is built
in the training process, on its device. Resume stays exact: the same (step, micro) reads the same rows
with any number of workers, and a test checks the losses bitwise.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset


class MicroBatchRows(Dataset):
    """Item i -> (step, micro, row indices, rows) for micro-batch i after `start_step`."""

    def __init__(self, rows, order, start_step: int, max_steps: int, accum: int):
        self.rows, self.order, self.start, self.accum = rows, order, start_step, accum
        self.count = max(0, max_steps - start_step) * accum

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        step, micro = divmod(i, self.accum)
        step += self.start
        indices = self.order.rows(step, micro)
        return step, micro, indices, [self.rows[k] for k in indices]


def _as_is(item):
    return item


def micro_batches(rows, order, start_step: int, max_steps: int, accum: int, workers: int, prefetch: int):
    """Iterator over (step, micro, row indices, rows) in training order, read ahead by `workers`."""
    dataset = MicroBatchRows(rows, order, start_step, max_steps, accum)
    if workers == 0:
        return (dataset[i] for i in range(len(dataset)))
    loader = DataLoader(
        dataset,
        batch_size=None,  # an item is already a micro-batch
        shuffle=False,  # the order is SampleOrder's
        num_workers=workers,
        prefetch_factor=prefetch,
        collate_fn=_as_is,
    )
    return iter(loader)
