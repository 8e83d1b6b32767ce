"""Rejected suffixes held per request slot (``req_pool_idx``), as dense device tensors.

SGLang's scheduler reorders, filters and merges batches between steps, but a
running request keeps its ``req_pool_idx`` until it finishes, is aborted or is
retracted. So the worker keys each request's `RejectedSuffix` by that slot, in
preallocated ``[num_slots, X, ...]`` tensors a batch gathers with
``batch.req_pool_indices`` (no per-request Python objects on the hot path; this
is `sglang_reanchor.suffix.SuffixStore` laid out for a device batch).

Lifetimes:

- `put` after every verify round (copied: SGLang overwrites the verify hidden
  states on its next forward);
- `reset` on prefill (a new or re-admitted request starts with none);
- `retain_only` at every decode step frees the slots of requests no longer
  running (finished, aborted or retracted ones leave the running batch);
- `gather` ignores an entry whose start is not the request's current length, so
  stale state can never be drafted from.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..suffix import RejectedSuffix

__all__ = ["SlotSuffixStore"]


class SlotSuffixStore:
    """``max_len`` suffix entries for each of ``num_slots`` request slots.

    Parameters
    ----------
    num_slots : int
        SGLang's ``req_to_token_pool.size``.
    max_len : int
        ``X = max(offsets)``: the longest prefix of a suffix ever read.
    feature_dim : int
        ``K * H``, the width of the target's captured hidden states.
    """

    def __init__(self, num_slots: int, max_len: int, feature_dim: int, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if num_slots < 1 or max_len < 0 or feature_dim < 1:
            raise ValueError(f"need num_slots >= 1, max_len >= 0, feature_dim >= 1; got {num_slots}, {max_len}, {feature_dim}")
        self.max_len = max_len
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)  # [P]
        self.starts = torch.full((num_slots,), -1, dtype=torch.long, device=device)  # [P]
        self.tokens = torch.zeros(num_slots, max_len, dtype=torch.long, device=device)  # [P, X]
        self.predictions = torch.zeros(num_slots, max_len, dtype=torch.long, device=device)  # [P, X]
        self.features = torch.zeros(num_slots, max_len, feature_dim, dtype=dtype, device=device)  # [P, X, D]

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
        self.tokens[slots] = 0
        self.predictions[slots] = 0
        if keep:
            self.tokens[slots, :keep] = tokens[:, :keep].long()
            self.predictions[slots, :keep] = predictions[:, :keep].long()
            self.features[slots, :keep] = features[:, :keep].to(self.features.dtype)

    def gather(self, slots: Tensor, prefix_lens: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(lengths [bs], tokens [bs, X], predictions [bs, X], features [bs, X, D])`` of ``slots``.

        A length is 0 where the stored suffix does not start at ``prefix_lens``.
        """
        lengths = torch.where(self.starts[slots] == prefix_lens.long(), self.lengths[slots], 0)
        return lengths, self.tokens[slots], self.predictions[slots], self.features[slots]

    def get(self, slot: int) -> RejectedSuffix | None:
        """Slot ``slot``'s suffix as a `RejectedSuffix` (None if it holds none)."""
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
        """Slots holding a suffix (possibly empty)."""
        return int((self.starts >= 0).sum())
