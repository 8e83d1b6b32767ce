"""Tree-verify attention metadata for a KV cache of token slots (page size 1).

:class:`TreeBatch` is the spec (trees, prefix lengths, KV slots); :func:`plan_tree_batch`
turns it into :class:`TreePlan`, the arrays FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper.plan`` takes with ``page_size=1``; this package's
backends take them through :meth:`attention.layout.TreeAttentionSpec.from_tree_plan`.
Pure torch, no FlashInfer import. Only the GPU check and the tests use it.

KV layout of request b: ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` lists its
``P_b`` committed prefix slots, then the slots of its ``N_b`` tree nodes in node order
(SGLang writes the draft tokens' KV to ``req_to_token[req, P_b:P_b + N_b]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attention.masks import check_parents, sglang_full_mask, tree_depths
from attention.packing import segment_packbits

__all__ = ["TreeBatch", "TreePlan", "plan_tree_batch"]


@dataclass(frozen=True)
class TreeBatch:
    """A batch of draft trees to verify against a token-slot KV cache.

    Build with :meth:`from_lists` in tests; all tensors share one device.
    """

    parents: tuple[Tensor, ...]  # bs x [N_b] int64; parents[0] = -1, parents[i] < i
    prefix_lens: Tensor  # [bs] int64, P_b
    kv_indices: Tensor  # [sum_b (P_b + N_b)] int64 slots: request b's prefix, then its tree nodes

    def __post_init__(self) -> None:
        if len(self.parents) == 0:
            raise ValueError("parents must hold at least one tree")
        device = self.kv_indices.device
        if self.prefix_lens.device != device or any(p.device != device for p in self.parents):
            raise ValueError(f"parents, prefix_lens and kv_indices must all be on one device ({device})")
        for b, p in enumerate(self.parents):
            check_parents(p, name=f"parents[{b}]")
        if self.prefix_lens.dim() != 1 or self.prefix_lens.dtype != torch.int64:
            raise ValueError("prefix_lens must be a 1-D int64 tensor of shape [bs]")
        if self.prefix_lens.numel() != len(self.parents):
            raise ValueError(f"prefix_lens has {self.prefix_lens.numel()} entries, parents has {len(self.parents)}")
        if bool((self.prefix_lens < 0).any()):
            raise ValueError("prefix_lens must be >= 0")
        if self.kv_indices.dim() != 1 or self.kv_indices.dtype not in (torch.int32, torch.int64):
            raise ValueError("kv_indices must be a 1-D int32/int64 tensor")
        expected = int(self.prefix_lens.sum()) + sum(p.numel() for p in self.parents)
        if self.kv_indices.numel() != expected:
            raise ValueError(f"kv_indices has {self.kv_indices.numel()} slots, expected sum(P_b + N_b) = {expected}")

    @property
    def num_nodes(self) -> list[int]:
        """``N_b`` per request."""
        return [p.numel() for p in self.parents]

    @classmethod
    def from_lists(
        cls,
        parents: Sequence[Sequence[int]],
        prefix_lens: Sequence[int],
        kv_indices: Sequence[Sequence[int]] | None = None,
        device: torch.device | str = "cpu",
    ) -> TreeBatch:
        """Build from Python lists; ``kv_indices=None`` gives consecutive slots from 0.

        Examples
        --------
        >>> batch = TreeBatch.from_lists([[-1, 0, 0, 1], [-1, 0]], [2, 1])
        >>> batch.kv_indices.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7, 8]
        """
        trees = tuple(torch.tensor(list(p), dtype=torch.int64, device=device) for p in parents)
        lens = torch.tensor(list(prefix_lens), dtype=torch.int64, device=device)
        if kv_indices is None:
            total = sum(int(p) for p in prefix_lens) + sum(len(p) for p in parents)
            slots = torch.arange(total, dtype=torch.int64, device=device)
        else:
            slots = torch.tensor([s for req in kv_indices for s in req], dtype=torch.int64, device=device)
        return cls(parents=trees, prefix_lens=lens, kv_indices=slots)


@dataclass(frozen=True)
class TreePlan:
    """Arrays for ``BatchPrefillWithPagedKVCacheWrapper.plan(..., page_size=1)``.

    ``custom_mask`` is what to hand to FlashInfer's ``plan``. ``packed_custom_mask`` and
    ``mask_indptr`` are what FlashInfer's kernel reads after packing (byte offsets),
    for preallocated CUDA-graph buffers (``custom_mask_buf`` / ``mask_indptr_buf``).
    Do not pass ``packed_custom_mask`` to ``plan()`` for bs > 1: in flashinfer 0.7.2
    ``plan`` then recomputes ``mask_indptr`` in bits, not bytes.
    """

    qo_indptr: Tensor  # [bs + 1] int32, qo_indptr[b+1] - qo_indptr[b] = N_b
    kv_indptr: Tensor  # [bs + 1] int32, kv_len_b = P_b + N_b pages of one token
    kv_indices: Tensor  # [kv_indptr[-1]] int32 slot (= page) ids
    kv_last_page_len: Tensor  # [bs] int32, all 1 (page size 1)
    custom_mask: Tensor  # [sum_b N_b * (P_b + N_b)] bool, SGLang FULL_MASK layout, True = attend
    packed_custom_mask: Tensor  # [mask_indptr[-1]] uint8, per-request segments, bits LSB first
    mask_indptr: Tensor  # [bs + 1] int32 byte offsets into packed_custom_mask
    positions: Tensor  # [qo_indptr[-1]] int64, P_b + depth of the node (RoPE position)


def plan_tree_batch(batch: TreeBatch) -> TreePlan:
    """Turn a batch of trees into page-size-1 tree-verify attention metadata.

    Parameters
    ----------
    batch : TreeBatch
        Trees, prefix lengths and KV slots.

    Returns
    -------
    TreePlan
        All tensors on ``batch.kv_indices.device``.

    Examples
    --------
    >>> plan = plan_tree_batch(TreeBatch.from_lists([[-1, 0, 0, 1], [-1, 0]], [2, 1]))
    >>> plan.qo_indptr.tolist(), plan.kv_indptr.tolist(), plan.mask_indptr.tolist()
    ([0, 4, 6], [0, 6, 9], [0, 3, 4])
    >>> plan.packed_custom_mask.tolist(), plan.positions.tolist()
    ([199, 115, 189, 59], [2, 3, 3, 4, 1, 2])
    """
    device = batch.kv_indices.device
    num_nodes = torch.tensor(batch.num_nodes, dtype=torch.int64, device=device)
    prefix = batch.prefix_lens.to(device)
    kv_lens = prefix + num_nodes
    bs = num_nodes.numel()

    def indptr(lens: Tensor) -> Tensor:
        out = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        out[1:] = torch.cumsum(lens, 0)
        return out

    custom_mask = sglang_full_mask(batch.parents, prefix).to(device)
    packed, mask_indptr = segment_packbits(custom_mask, indptr(num_nodes * kv_lens))
    positions = torch.repeat_interleave(prefix, num_nodes) + tree_depths(batch.parents).to(device)
    return TreePlan(
        qo_indptr=indptr(num_nodes),
        kv_indptr=indptr(kv_lens),
        kv_indices=batch.kv_indices.to(torch.int32),
        kv_last_page_len=torch.ones(bs, dtype=torch.int32, device=device),
        custom_mask=custom_mask,
        packed_custom_mask=packed,
        mask_indptr=mask_indptr,
        positions=positions,
    )
