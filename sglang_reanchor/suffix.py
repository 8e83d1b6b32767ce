"""The rejected suffix of a request, and a bounded per-request store of them.

After a verify round the target has computed features for rejected draft nodes
too. For the heavy path below the last accepted node (see `verify.py`) we keep,
at positions ``s, s+1, ..., s+L-1`` (``s`` = the next bonus position):

- ``tokens``       ``r``: the rejected draft tokens,
- ``features``     ``F``: the target features there (concatenated target layers),
- ``predictions``  ``y[s+1..s+L]``: the target's top-1 after each of them.

Shifted row ``d`` of the next round anchors at ``y[s+d]`` (``predictions[d-1]``)
and sees ``F[s..s+d-1]`` (``features[:d]``). Only ``max(offsets)`` entries are ever
read, so only that many are stored: memory per request is bounded by
``max_len * feature_dim``, and the store holds at most ``max_requests`` entries.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["RejectedSuffix", "SuffixStore"]


@dataclass(frozen=True)
class RejectedSuffix:
    """One request's rejected suffix (``L`` may be 0)."""

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

    def truncate(self, max_len: int) -> RejectedSuffix:
        """The first ``max_len`` entries, copied so the verify buffers can be freed."""
        return RejectedSuffix(
            start=self.start,
            tokens=self.tokens[:max_len].clone(),
            predictions=self.predictions[:max_len].clone(),
            features=self.features[:max_len].clone(),
        )

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tokens, self.predictions, self.features))


class SuffixStore:
    """Per-request rejected suffixes, bounded in length and in count.

    ``put`` replaces a request's entry (a new round supersedes the old suffix);
    ``release`` frees it when the request finishes or is aborted. The store never
    grows past ``max_requests`` entries: a ``put`` for a new request when full
    raises instead of silently dropping another request's state.
    """

    def __init__(self, max_len: int, max_requests: int) -> None:
        if max_len < 0 or max_requests < 1:
            raise ValueError(f"SuffixStore needs max_len >= 0 and max_requests >= 1, got {max_len}, {max_requests}")
        self.max_len = max_len
        self.max_requests = max_requests
        self._entries: dict[Hashable, RejectedSuffix] = {}

    def put(self, request: Hashable, suffix: RejectedSuffix) -> None:
        if request not in self._entries and len(self._entries) >= self.max_requests:
            raise RuntimeError(
                f"SuffixStore is full ({self.max_requests} requests); release finished requests "
                "or raise ReAnchorConfig.max_requests"
            )
        self._entries[request] = suffix.truncate(self.max_len)

    def get(self, request: Hashable) -> RejectedSuffix | None:
        return self._entries.get(request)

    def release(self, request: Hashable) -> None:
        """Forget ``request`` (no error if it holds nothing)."""
        self._entries.pop(request, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request: Hashable) -> bool:
        return request in self._entries

    @property
    def nbytes(self) -> int:
        """Bytes held by all entries."""
        return sum(s.nbytes for s in self._entries.values())

    @staticmethod
    def empty(start: int, feature_dim: int, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> RejectedSuffix:
        """A zero-length suffix (after a round that accepted a whole branch)."""
        z = torch.zeros(0, dtype=torch.long, device=device)
        return RejectedSuffix(start=start, tokens=z, predictions=z.clone(), features=torch.zeros(0, feature_dim, device=device, dtype=dtype))
