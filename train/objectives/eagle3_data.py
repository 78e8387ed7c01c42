"""EAGLE-3 training batches, online (the frozen target runs inside the step) or offline (capture shards).

    batch = online_batch(target, rows, aux_layers)       # rows: [{"input_ids": [T], "loss_mask": [T]}]
    batch = offline_batch(target, capture_folder_rows)   # rows of CaptureFolder (data capture output)

Both build the same `TTTBatch` through the same code: features are the aux hidden states concatenated in
aux-layer order, and the last layer's pre-norm output (what capture stores) from which the objective
computes the target's logits (`target.logits`), only at the positions a loss reads. Rows are
right-padded; `valid` marks real tokens. With float32 storage the two modes give identical tensors,
hence identical losses.
"""

from __future__ import annotations

import torch

from draftsmith.data_recipes.capture import capture_batch
from draftsmith.train.objectives.eagle3_objective import TTTBatch


def pad_rows(rows: list[torch.Tensor], value=0) -> torch.Tensor:
    """Right-pad [T_i, ...] tensors with `value` into one [B, max T_i, ...] tensor."""
    length = max(r.shape[0] for r in rows)
    out = rows[0].new_full((len(rows), length, *rows[0].shape[1:]), value)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def _batch(target, ids, masks, aux, last) -> TTTBatch:
    valid = pad_rows([torch.ones(len(i), dtype=torch.bool) for i in ids], False)
    return TTTBatch(
        input_ids=pad_rows(ids).to(target.device),
        features=pad_rows(aux).to(target.device),
        target_hidden=pad_rows(last).to(target.device, target.dtype),  # [B, T, Ht]
        loss_mask=pad_rows(masks).to(target.device),
        valid=valid.to(target.device),
    )


def online_batch(target, rows: list[dict], aux_layers) -> TTTBatch:
    """Run the frozen target on each row (one forward per row, as capture does) and build the batch."""
    ids = [torch.as_tensor(r["input_ids"], dtype=torch.long) for r in rows]
    masks = [torch.as_tensor(r["loss_mask"], dtype=torch.long) for r in rows]
    aux, last = [], []
    with torch.no_grad():
        for row_ids in ids:
            out = capture_batch(target, row_ids[None], aux_layers)
            aux.append(out["aux_hidden"][0])
            last.append(out["last_hidden"][0])
    return _batch(target, ids, masks, aux, last)


def offline_batch(target, rows: list[dict]) -> TTTBatch:
    """Rows read from a capture folder (`CaptureFolder(...)[i]`), in their stored dtype, to the batch."""
    ids = [r["input_ids"].long() for r in rows]
    masks = [r["loss_mask"].long() for r in rows]
    aux = [r["aux_hidden"].to(target.dtype) for r in rows]
    last = [r["last_hidden"].to(target.dtype) for r in rows]
    return _batch(target, ids, masks, aux, last)
