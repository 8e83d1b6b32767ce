"""The rejected suffix of a request, and the bounded store that keeps it between rounds.

After a verify round the target has computed features for rejected draft nodes
too. For the heavy path below the last accepted node (see `verify.py`) we keep,
at positions ``s, s+1, ..., s+L-1`` (``s`` = the next bonus position):

- ``tokens``       ``r``: the rejected draft tokens,
- ``features``     ``F``: the target features there (concatenated target layers),
- ``predictions``  ``y[s+1..s+L]``: the target's top-1 after each of them.

Shifted row ``d`` of the next round anchors at ``y[s+d]`` (``predictions[d-1]``)
and sees ``F[s..s+d-1]`` (``features[:d]``). Only ``X = max(offsets)`` entries are
ever read, so only that many are stored.

`SuffixStore` holds them per request *slot* in preallocated ``[num_slots, X, ...]``
device tensors that a batch reads and writes with one gather / scatter each, with
no per-request Python object and no host read: the reference engine gives each
running request a slot, SGLang's worker uses the request's ``req_pool_idx``. Memory
is fixed at construction: ``num_slots * X * (feature_dim + 2)`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RejectedSuffix", "SuffixStore"]


@dataclass(frozen=True)
class RejectedSuffix:
    """One request's rejected suffix (``L`` may be 0), as `SuffixStore.get` returns it."""

    start: int  # s: position of tokens[0] (the next bonus position)
    tokens: Tensor  # [L] long: rejected draft tokens r[s..s+L-1]
    predictions: Tensor  # [L] long: target top-1 y[s+1..s+L]
    features: Tensor  # [L, K*H]: target features F[s..s+L-1]

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.ndim != 1 or self.predictions.shape != (n,) or self.features.ndim != 2 or self.features.shape[0] != n:
            raise ValueError(
                "RejectedSuffix expects tokens [L], predictions [L], features [L, K*H]; got "
                f"{tuple(self.tokens.shape)}, {tuple(self.predictions.shape)}, {tuple(self.features.shape)}"
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True)
class SuffixBatch:
    """The stored suffixes of a batch's slots (`SuffixStore.gather`)."""

    lengths: Tensor  # [bs] long: usable entries (0 where none, or where it starts elsewhere)
    tokens: Tensor  # [bs, X] long
    predictions: Tensor  # [bs, X] long
    features: Tensor  # [bs, X, D]


class SuffixStore:
    """``max_len`` suffix entries for each of ``num_slots`` request slots.

    Parameters
    ----------
    num_slots : int
        Requests that can hold a suffix at once (SGLang: ``req_to_token_pool.size + 1``).
    max_len : int
        ``X = max(offsets)``: the longest prefix of a suffix ever read.
    feature_dim : int
        ``K * H``, the width of the target's captured hidden states.

    Lifetimes: `put` after every verify round (a copy: the verify buffers are
    overwritten by the next forward); `reset` when a slot gets a new request;
    `retain_only` frees every slot outside a running batch (finished, aborted or
    retracted requests); `gather` ignores an entry that does not start at the
    request's current length, so stale state can never be drafted from.
    """

    def __init__(self, num_slots: int, max_len: int, feature_dim: int, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if num_slots < 1 or max_len < 0 or feature_dim < 1:
            raise ValueError(f"SuffixStore needs num_slots >= 1, max_len >= 0, feature_dim >= 1; got "
                             f"{num_slots}, {max_len}, {feature_dim}")
        self.max_len = max_len
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)  # [P]
        self.starts = torch.full((num_slots,), -1, dtype=torch.long, device=device)  # [P]
        self.tokens = torch.zeros(num_slots, max_len, dtype=torch.long, device=device)  # [P, X]
        self.predictions = torch.zeros(num_slots, max_len, dtype=torch.long, device=device)  # [P, X]
        self.features = torch.zeros(num_slots, max_len, feature_dim, dtype=dtype, device=device)  # [P, X, D]

    @property
    def num_slots(self) -> int:
        return self.lengths.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held (fixed at construction)."""
        return sum(t.numel() * t.element_size() for t in (self.lengths, self.starts, self.tokens,
                                                          self.predictions, self.features))

    def reset(self, slots: Tensor) -> None:
        """Forget the suffixes of ``slots`` (``[n]`` long)."""
        self.lengths[slots] = 0
        self.starts[slots] = -1

    def retain_only(self, slots: Tensor) -> None:
        """Forget every slot not in ``slots`` (the running batch)."""
        keep = torch.zeros_like(self.lengths, dtype=torch.bool)
        keep[slots] = True
        self.lengths.masked_fill_(~keep, 0)
        self.starts.masked_fill_(~keep, -1)

    def put(self, slots: Tensor, starts: Tensor, lengths: Tensor, tokens: Tensor,
            predictions: Tensor, features: Tensor) -> None:
        """Store a round's suffixes, truncated to ``max_len``.

        ``slots``, ``starts``, ``lengths``: ``[bs]`` long; ``tokens``,
        ``predictions``: ``[bs, S]`` long; ``features``: ``[bs, S, D]``.
        """
        keep = min(self.max_len, tokens.shape[1])
        self.lengths[slots] = lengths.long().clamp(max=self.max_len)
        self.starts[slots] = starts.long()
        if keep < self.max_len:  # entries past a short suffix are never read (lengths), but keep them clean
            self.tokens[slots] = 0
            self.predictions[slots] = 0
        if keep:
            self.tokens[slots, :keep] = tokens[:, :keep].long()
            self.predictions[slots, :keep] = predictions[:, :keep].long()
            self.features[slots, :keep] = features[:, :keep].to(self.features.dtype)

    def gather(self, slots: Tensor, prefix_lens: Tensor) -> SuffixBatch:
        """The suffixes of ``slots`` (``[bs]`` long) for requests with ``prefix_lens`` committed tokens.

        A length is 0 where the stored suffix does not start at ``prefix_lens``.
        """
        lengths = torch.where(self.starts[slots] == prefix_lens.long(), self.lengths[slots], 0)
        return SuffixBatch(lengths, self.tokens[slots], self.predictions[slots], self.features[slots])

    def get(self, slot: int) -> RejectedSuffix | None:
        """Slot ``slot``'s suffix as a `RejectedSuffix` (None if it holds none). Reads the host."""
        if int(self.starts[slot]) < 0:
            return None
        n = int(self.lengths[slot])
        return RejectedSuffix(
            start=int(self.starts[slot]),
            tokens=self.tokens[slot, :n].clone(),
            predictions=self.predictions[slot, :n].clone(),
            features=self.features[slot, :n].clone(),
        )

    def __len__(self) -> int:
        """Slots holding a suffix (possibly empty). Reads the host."""
        return int((self.starts >= 0).sum())
