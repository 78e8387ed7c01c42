"""A preallocated KV cache with a per-slot validity mask, cropping and path compaction.

It duck-types transformers' `Cache.update(key, value, layer_idx, ...)`, so the target's own decoder
layers write into it, while we own the layout:

    keys[l], values[l]   # [B, Hkv, C, D] and [B, Hkv, C, Dv] per layer, C = capacity (grows by doubling
                         # when needed); Dv = D except for MLA targets, which cache two latents of different
                         # widths (runtime/core/mla.py)
    valid                # [B, C] bool: slot holds a real token (False for left padding and holes)
    length               # slots in use, the same for every row
    holes                # host knowledge, never read from the device: some slot may be invalid (every
                         # forward then builds its mask; False keeps SDPA's own causal kernel)

Rows may differ in how many real tokens they hold (padding, ragged acceptance later): that is `valid`'s
job, and attention masks are built from it. `crop(n)` drops slots >= n (rejected draft tokens);
`compact(start, keep)` moves the slots `keep` [B, n] to `start..start+n` (the accepted tree path) so a
verification never has to be recomputed.
"""

from __future__ import annotations

import torch

from draftsmith import kernels
from draftsmith.runtime.verify.draft_batch import to_device


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
        value_dim: int | None = None,  # the values' width when it differs from the keys' (MLA)
    ):
        shape = (batch, num_kv_heads, max(capacity, 1), head_dim)
        value_shape = (*shape[:3], value_dim or head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(value_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.valid = torch.zeros(batch, shape[2], dtype=torch.bool, device=device)  # [B, C]
        self.length = 0
        self._pending = 0  # tokens being written by the forward in flight
        self.holes = False  # set once a write or a compaction may leave an invalid slot

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def reserve(self, new_tokens: int, token_valid: torch.Tensor, dense: bool = False) -> None:
        """Open `new_tokens` slots for the next forward; token_valid [B, T] marks the real ones (`dense`:
        the caller knows they all are)."""
        self.holes |= not dense
        need = self.length + new_tokens
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        self.valid[:, self.length : need] = token_valid
        self._pending = new_tokens

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer with key [B, Hkv, T, D], value [B, Hkv, T, Dv]; returns the
        layer's full K/V."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def commit(self) -> None:
        """Make the slots written by the last forward part of the cache."""
        self.length += self._pending
        self._pending = 0

    def crop(self, length: int) -> None:
        """Forget every slot at or after `length`."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length {length} outside [0, {self.length}]")
        self.valid[:, length:] = False
        self.length = length

    def compact(self, start: int, keep: torch.Tensor, keep_valid: torch.Tensor | None = None) -> None:
        """Move slots keep [B, n] (absolute slot ids >= start, increasing) to start..start+n, drop the rest.

        Used after tree verification: the accepted path's K/V are already computed, so we gather them
        instead of running the target again. Rows that keep fewer slots pad `keep` with any slot id and
        pass keep_valid [B, n] False there: those slots become holes."""
        n = keep.shape[1]
        for cache in (self.keys, self.values):
            for t in cache:
                # [B, Hkv, C, D]: slots keep[b] -> start..start+n-1 (Triton on CUDA, torch elsewhere)
                kernels.kv_compact(t, start, keep)
        kept_valid = self.valid.gather(1, keep)
        if keep_valid is not None:
            kept_valid &= keep_valid
            self.holes = True
        self.valid[:, start : start + n] = kept_valid
        self.crop(start + n)

    def keep_rows(self, start: int, rows: list[list[int]]) -> None:
        """`compact` from host lists: row b keeps the slots rows[b] (absolute, increasing), padded where
        rows are shorter; copied to the device without a synchronization."""
        width = max(map(len, rows))
        keep = torch.full((len(rows), width), start, dtype=torch.long)
        keep_valid = torch.zeros(keep.shape, dtype=torch.bool)
        for b, slots in enumerate(rows):
            keep[b, : len(slots)] = torch.tensor(slots, dtype=torch.long)
            keep_valid[b, : len(slots)] = True
        device = self.valid.device
        ragged = min(map(len, rows)) < width  # only then can holes appear
        self.compact(start, to_device(keep, device), to_device(keep_valid, device) if ragged else None)

    def keep_prefixes(self, start: int, lengths: list[int]) -> None:
        """Row b keeps its slots start..start+lengths[b]-1 where they are; later slots become holes and
        the cache ends at start + max(lengths). Equals `compact` with keep = start + arange, no copies."""
        end = start + max(lengths)
        self.holes |= min(lengths) < max(lengths)
        slots = torch.arange(end - start, device=self.valid.device)  # [n]
        row_lengths = torch.tensor(lengths, device=self.valid.device)
        self.valid[:, start:end] &= slots[None, :] < row_lengths[:, None]
        self.crop(end)

    def retain(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (finished rows leave the batch)."""
        self.keys = [t[rows] for t in self.keys]
        self.values = [t[rows] for t in self.values]
        self.valid = self.valid[rows]

    def _grow(self, capacity: int) -> None:
        def grow(t: torch.Tensor) -> torch.Tensor:
            bigger = t.new_zeros(*t.shape[:2], capacity, t.shape[3])
            bigger[:, :, : t.shape[2]] = t
            return bigger

        self.keys = [grow(t) for t in self.keys]
        self.values = [grow(t) for t in self.values]
        valid = self.valid.new_zeros(self.batch, capacity)
        valid[:, : self.valid.shape[1]] = self.valid
        self.valid = valid
