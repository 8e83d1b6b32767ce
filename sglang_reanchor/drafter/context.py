"""Drafter context K/V: target features turned into per-layer keys and values.

DFlash injects the target's hidden states into every drafter layer as extra keys and
values (never as queries). `DFlashDrafter.project_context` computes them once per
context row; `ContextKV` holds them and `DraftContextCache` keeps the committed ones
of a request across rounds (the role of z-lab's draft ``DynamicCache``, which also
only ever holds context K/V: the block's own K/V is cropped away after each draft).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ContextKV", "DraftContextCache"]


@dataclass(frozen=True)
class ContextKV:
    """Per-layer context keys and values, already k_norm-ed and rotated (RoPE).

    Attributes
    ----------
    keys : tuple of Tensor
        One per drafter layer, ``[bs, num_kv_heads, C, head_dim]``.
    values : tuple of Tensor
        One per drafter layer, ``[bs, num_kv_heads, C, head_dim]``.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.values) or not self.keys:
            raise ValueError(
                f"ContextKV needs one key and one value tensor per layer, "
                f"got {len(self.keys)} keys and {len(self.values)} values"
            )

    @property
    def length(self) -> int:
        """Number of context positions ``C``."""
        return self.keys[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def cat(self, other: ContextKV) -> ContextKV:
        """Concatenate along the sequence axis: ``self`` first, then ``other``.

        A batch of 1 is broadcast to the other side's batch (one request's shared
        committed context next to per-row extra context).
        """
        bs = max(self.batch_size, other.batch_size)

        def join(a: Tensor, b: Tensor) -> Tensor:
            return torch.cat([a.expand(bs, -1, -1, -1), b.expand(bs, -1, -1, -1)], dim=2)

        return ContextKV(
            keys=tuple(join(a, b) for a, b in zip(self.keys, other.keys, strict=True)),
            values=tuple(join(a, b) for a, b in zip(self.values, other.values, strict=True)),
        )

    def narrow(self, start: int, length: int) -> ContextKV:
        """Context positions ``start .. start+length-1`` (a view, no copy)."""
        return ContextKV(
            keys=tuple(k.narrow(2, start, length) for k in self.keys),
            values=tuple(v.narrow(2, start, length) for v in self.values),
        )

    def select_rows(self, rows: Tensor | slice) -> ContextKV:
        """Batch rows ``rows`` (index tensor or slice) of every layer's K/V."""
        return ContextKV(
            keys=tuple(k[rows] for k in self.keys),
            values=tuple(v[rows] for v in self.values),
        )


class DraftContextCache:
    """Committed context K/V of one request: positions ``0 .. length-1``.

    Rows drafted for the request share it (usually stored with batch 1, broadcast on
    use). Only committed (accepted) positions belong here; a round's extra context,
    such as ReAnchor's rejected-suffix features, is passed to the drafter separately
    and never appended. Storage grows by doubling, so appending a round's few rows
    does not copy the whole history and `crop` is free.
    """

    def __init__(self) -> None:
        self._keys: list[Tensor] = []  # per layer [bs, num_kv_heads, capacity, head_dim]
        self._values: list[Tensor] = []
        self._length = 0

    @property
    def length(self) -> int:
        """Number of committed context positions."""
        return self._length

    @property
    def kv(self) -> ContextKV | None:
        """The committed K/V, each ``[bs, num_kv_heads, length, head_dim]``; None if empty.

        Views into the cache's storage: valid until the next `crop` + `append`.
        """
        if self._length == 0:
            return None
        return ContextKV(
            keys=tuple(k[:, :, : self._length] for k in self._keys),
            values=tuple(v[:, :, : self._length] for v in self._values),
        )

    def append(self, kv: ContextKV) -> None:
        """Add context K/V for positions ``length .. length + kv.length - 1``."""
        if self._keys and (
            len(kv.keys) != len(self._keys) or kv.batch_size != self._keys[0].shape[0]
        ):
            raise ValueError(
                f"ContextKV with {len(kv.keys)} layers and batch {kv.batch_size} does not "
                f"match the cache ({len(self._keys)} layers, batch {self._keys[0].shape[0]})"
            )
        new_length = self._length + kv.length
        if not self._keys or new_length > self._keys[0].shape[2]:
            capacity = max(new_length, 2 * (self._keys[0].shape[2] if self._keys else 0), 16)
            self._keys = [self._grow(old, new, capacity) for old, new in
                          zip(self._keys or kv.keys, kv.keys, strict=True)]
            self._values = [self._grow(old, new, capacity) for old, new in
                            zip(self._values or kv.values, kv.values, strict=True)]
        for buf, new in zip(self._keys, kv.keys, strict=True):
            buf[:, :, self._length : new_length] = new
        for buf, new in zip(self._values, kv.values, strict=True):
            buf[:, :, self._length : new_length] = new
        self._length = new_length

    def _grow(self, old: Tensor, like: Tensor, capacity: int) -> Tensor:
        bs, heads, _, dim = like.shape
        buf = like.new_empty(bs, heads, capacity, dim)
        if self._length:
            buf[:, :, : self._length] = old[:, :, : self._length]
        return buf

    def crop(self, length: int) -> None:
        """Keep only positions ``0 .. length-1`` (z-lab crops its draft cache the same way)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"crop length must be in [0, {self._length}], got {length}")
        self._length = length

    def reset(self) -> None:
        """Forget all context and free the storage (a new request)."""
        self._keys, self._values, self._length = [], [], 0
