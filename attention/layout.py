"""The plan step of tree attention: one spec in, a validated layout out; the backend contract.

FlashInfer's lifecycle, for any ragged batch of queries over a token-slot KV cache (page size 1)
with a custom mask (a draft tree's FULL_MASK, or any other)::

    layout = plan_tree_attention(TreeAttentionSpec(...))       # once per forward: validates, host reads
    out = backend.run(layout, q, k_cache, v_cache)              # per layer: device work only

:func:`plan_tree_attention` checks the spec and reads the indptrs (and the largest used slot)
on the host, once. A backend's ``run`` (the :class:`TreeAttentionBackend` signature, the only
one) reads nothing from the device: it checks ``q`` / ``k_cache`` / ``v_cache`` metadata
(shape, dtype, device) against the layout and launches. Backends: ``attention.reference``
(:class:`~attention.reference.TorchTreeAttention`, torch) and ``attention.triton_tree``
(:class:`~attention.triton_tree.TritonTreeAttention`, Triton, imported only when wanted);
:func:`attention.tree_attn.get_backend` picks one by name.

This module imports only torch; the backends import it, never the other way round.

Request b's queries are rows ``qo_indptr[b]:qo_indptr[b+1]`` of ``q`` (its ``N_b`` nodes); its
keys/values are the cache rows ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (``kv_len_b`` of them:
prefix slots, then its nodes' slots); its mask is the row-major ``[N_b, kv_len_b]`` block of
``custom_mask`` (True = attend), blocks concatenated in request order (SGLang FULL_MASK, see
:mod:`attention`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attention.plan import TreePlan

__all__ = [
    "TreeAttentionBackend",
    "TreeAttentionLayout",
    "TreeAttentionSpec",
    "check_run_inputs",
    "plan_tree_attention",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class TreeAttentionSpec:
    """One forward's attention pattern, as FlashInfer's ``plan()`` takes it (page size 1).

    All tensors on one device (the device the backends will run on).
    """

    qo_indptr: Tensor  # [bs + 1] int32/int64, qo_indptr[-1] = q.shape[0]
    kv_indptr: Tensor  # [bs + 1] int32/int64
    kv_indices: Tensor  # [>= kv_indptr[-1]] int32/int64 slot ids
    custom_mask: Tensor  # [sum_b N_b * kv_len_b] bool, True = attend
    num_q_heads: int
    num_kv_heads: int  # num_q_heads is a multiple (GQA: query head h reads KV head h // group)
    head_dim: int
    sm_scale: float | None = None  # None: 1 / sqrt(head_dim)

    @classmethod
    def from_tree_plan(cls, plan: TreePlan, num_q_heads: int, num_kv_heads: int, head_dim: int,
                       sm_scale: float | None = None) -> TreeAttentionSpec:
        """The spec of a batch of draft trees laid out by :func:`attention.plan.plan_tree_batch`.

        >>> from attention.plan import TreeBatch, plan_tree_batch
        >>> tree = plan_tree_batch(TreeBatch.from_lists([[-1, 0, 0, 1], [-1, 0]], [2, 1]))
        >>> layout = plan_tree_attention(TreeAttentionSpec.from_tree_plan(tree, 4, 2, 16))
        >>> layout.qo_lens, layout.kv_lens, layout.mask_indptr.tolist()
        ((4, 2), (6, 3), [0, 24, 30])
        """
        return cls(qo_indptr=plan.qo_indptr, kv_indptr=plan.kv_indptr, kv_indices=plan.kv_indices,
                   custom_mask=plan.custom_mask, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                   head_dim=head_dim, sm_scale=sm_scale)


@dataclass(frozen=True)
class TreeAttentionLayout:
    """A validated :class:`TreeAttentionSpec` with the host facts a backend needs (no device reads)."""

    qo_indptr: Tensor  # [bs + 1] int32/int64 on `device`
    kv_indptr: Tensor  # [bs + 1] int32/int64 on `device`
    kv_indices: Tensor  # [>= kv_indptr[-1]] int32/int64 on `device`
    custom_mask: Tensor  # [sum_b N_b * kv_len_b] bool on `device`
    mask_indptr: Tensor  # [bs + 1] int64 on `device`: offset of request b's N_b x kv_len_b block
    qo_lens: tuple[int, ...]  # bs host ints, N_b
    kv_lens: tuple[int, ...]  # bs host ints, kv_len_b
    min_slots: int  # the cache must hold at least this many slots (largest used slot + 1)
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    sm_scale: float

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def total_q(self) -> int:
        return sum(self.qo_lens)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def device(self) -> torch.device:
        return self.qo_indptr.device


def _check_indptr(indptr: Tensor, name: str, device: torch.device) -> list[int]:
    if not isinstance(indptr, Tensor) or indptr.dim() != 1 or indptr.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor of shape [bs + 1]")
    if indptr.device != device:
        raise ValueError(f"{name} is on {indptr.device}, qo_indptr is on {device}")
    if indptr.numel() < 1:
        raise ValueError(f"{name} must have bs + 1 >= 1 entries")
    bounds = [int(x) for x in indptr.tolist()]
    if bounds[0] != 0 or any(a > b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{name} must start at 0 and be non-decreasing, got {bounds[:8]}...")
    return bounds


def plan_tree_attention(spec: TreeAttentionSpec) -> TreeAttentionLayout:
    """Validate ``spec`` and lay it out for the backends; raise ``ValueError`` naming the field.

    Reads ``qo_indptr``, ``kv_indptr`` and the min/max of the used ``kv_indices`` on the host
    (one device sync, once per forward).

    Returns
    -------
    TreeAttentionLayout
        On the spec's device.
    """
    if not isinstance(spec, TreeAttentionSpec):
        raise ValueError(f"plan_tree_attention takes a TreeAttentionSpec, got {type(spec).__name__}")
    q_heads, kv_heads, head_dim = spec.num_q_heads, spec.num_kv_heads, spec.head_dim
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    if kv_heads < 1 or q_heads % kv_heads != 0:
        raise ValueError(f"q heads ({q_heads}) must be a multiple of k_cache heads ({kv_heads})")
    if not isinstance(spec.qo_indptr, Tensor):
        raise ValueError("qo_indptr must be a 1-D int32/int64 tensor of shape [bs + 1]")
    device = spec.qo_indptr.device
    qo = _check_indptr(spec.qo_indptr, "qo_indptr", device)
    kv = _check_indptr(spec.kv_indptr, "kv_indptr", device)
    if len(qo) != len(kv):
        raise ValueError(f"qo_indptr has {len(qo)} entries, kv_indptr has {len(kv)}: both must be bs + 1")
    idx = spec.kv_indices
    if not isinstance(idx, Tensor) or idx.dim() != 1 or idx.dtype not in _INDEX_DTYPES:
        raise ValueError("kv_indices must be a 1-D int32/int64 tensor")
    if idx.device != device:
        raise ValueError(f"kv_indices is on {idx.device}, qo_indptr is on {device}")
    if kv[-1] > idx.numel():
        raise ValueError(f"kv_indptr[-1] = {kv[-1]} exceeds kv_indices.numel() = {idx.numel()}")
    used = idx[: kv[-1]]
    lo, hi = (int(used.min()), int(used.max())) if used.numel() else (0, -1)
    if lo < 0:
        raise ValueError(f"kv_indices must lie in [0, num_slots), got {lo}")

    qo_lens = tuple(b - a for a, b in itertools.pairwise(qo))
    kv_lens = tuple(b - a for a, b in itertools.pairwise(kv))
    mask = spec.custom_mask
    if not isinstance(mask, Tensor) or mask.dim() != 1 or mask.dtype != torch.bool:
        raise ValueError("custom_mask must be a 1-D bool tensor (flat FULL_MASK layout)")
    if mask.device != device:
        raise ValueError(f"custom_mask is on {mask.device}, qo_indptr is on {device}")
    sizes = [n * k for n, k in zip(qo_lens, kv_lens, strict=True)]
    if mask.numel() != sum(sizes):
        raise ValueError(f"custom_mask has {mask.numel()} entries, expected sum(N_b * kv_len_b) = {sum(sizes)}")
    mask_indptr = torch.zeros(len(qo), dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)

    scale = 1.0 / math.sqrt(head_dim) if spec.sm_scale is None else float(spec.sm_scale)
    if not math.isfinite(scale):
        raise ValueError(f"sm_scale must be finite, got {spec.sm_scale}")
    return TreeAttentionLayout(
        qo_indptr=spec.qo_indptr, kv_indptr=spec.kv_indptr, kv_indices=idx, custom_mask=mask,
        mask_indptr=mask_indptr.to(device), qo_lens=qo_lens, kv_lens=kv_lens, min_slots=hi + 1,
        num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim, sm_scale=scale,
    )


def check_run_inputs(layout: TreeAttentionLayout, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    """Check one layer's tensors against ``layout``: metadata only (shape, dtype, device), no device read.

    Raises ``ValueError`` naming the argument.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32/float16/bfloat16, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head_dim) dimension")
        if t.device != layout.device:
            raise ValueError(f"{name} is on {t.device}, the layout is on {layout.device}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q's ({q.dtype})")
    if q.shape[0] != layout.total_q:
        raise ValueError(f"qo_indptr[-1] = {layout.total_q} must equal q.shape[0] = {q.shape[0]}")
    if q.shape[1:] != (layout.num_q_heads, layout.head_dim):
        raise ValueError(f"q must be [*, {layout.num_q_heads} heads, head_dim {layout.head_dim}] as planned, "
                         f"got {tuple(q.shape)}")
    if k_cache.shape[2] != layout.head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[2]} != q head_dim {layout.head_dim}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if k_cache.shape[1] != layout.num_kv_heads:
        raise ValueError(f"k_cache has {k_cache.shape[1]} heads, planned for {layout.num_kv_heads}")
    if k_cache.shape[0] < layout.min_slots:
        raise ValueError(f"kv_indices must lie in [0, k_cache.shape[0] = {k_cache.shape[0]}), "
                         f"the largest is {layout.min_slots - 1}")


class TreeAttentionBackend(Protocol):
    """What every tree-attention backend provides: ``run``, once per layer, device work only."""

    name: str

    def run(self, layout: TreeAttentionLayout, q: Tensor, k_cache: Tensor, v_cache: Tensor,
            out: Tensor | None = None) -> Tensor:
        """Attention of the planned queries over a token-slot cache.

        Parameters
        ----------
        layout : TreeAttentionLayout
            From :func:`plan_tree_attention`, once per forward.
        q : Tensor
            ``[total_q, num_q_heads, head_dim]`` float32 / float16 / bfloat16.
        k_cache, v_cache : Tensor
            ``[num_slots >= layout.min_slots, num_kv_heads, head_dim]``, q's dtype.
        out : Tensor, optional
            ``[total_q, num_q_heads, head_dim]`` buffer in q's dtype; every element is overwritten.

        Returns
        -------
        Tensor
            ``[total_q, num_q_heads, head_dim]`` in q's dtype (``out`` when given). A row whose
            mask has no True entry gets zeros.
        """
        ...


def check_out(q: Tensor, out: Tensor | None) -> Tensor | None:
    """``out`` if it matches ``q`` (shape, dtype, device, contiguous last dim); raise otherwise."""
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or out.stride(-1) != 1):
        raise ValueError(f"out must match q ({q.dtype} {tuple(q.shape)} on {q.device}, contiguous last dim)")
    return out
