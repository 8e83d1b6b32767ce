"""Public tree-verify attention entry point: input contract, validation, backend choice.

:func:`tree_attention` checks its inputs once (:func:`check_tree_attention_inputs`,
which reads the indptrs on the host) and hands a :class:`TreeAttentionMeta` to a
backend: ``attention.triton_tree`` (Triton, imported lazily) or ``attention.reference``
(torch). Neither backend module is imported here at import time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["Backend", "TreeAttentionMeta", "check_tree_attention_inputs", "tree_attention"]

Backend = Literal["auto", "triton", "torch"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class TreeAttentionMeta:
    """Host-side facts about a validated batch (computed once, reused by a backend)."""

    qo_lens: tuple[int, ...]  # bs, N_b
    kv_lens: tuple[int, ...]  # bs, kv_len_b
    mask_indptr: Tensor  # [bs + 1] int64 on q.device, bool offsets of each request's N_b x kv_len_b block
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    sm_scale: float

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads


def _check_indptr(indptr: Tensor, name: str, device: torch.device) -> list[int]:
    if not isinstance(indptr, Tensor) or indptr.dim() != 1 or indptr.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor of shape [bs + 1]")
    if indptr.device != device:
        raise ValueError(f"{name} is on {indptr.device}, q is on {device}")
    if indptr.numel() < 1:
        raise ValueError(f"{name} must have bs + 1 >= 1 entries")
    bounds = [int(x) for x in indptr.tolist()]
    if bounds[0] != 0 or any(a > b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{name} must start at 0 and be non-decreasing, got {bounds[:8]}...")
    return bounds


def check_tree_attention_inputs(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    qo_indptr: Tensor,
    custom_mask: Tensor,
    sm_scale: float | None = None,
) -> TreeAttentionMeta:
    """Validate :func:`tree_attention`'s inputs; raise ``ValueError`` naming the argument.

    Reads ``qo_indptr``, ``kv_indptr`` and the min/max of the used ``kv_indices`` on the
    host (one device sync), so the call is not CUDA-graph capturable.

    Returns
    -------
    TreeAttentionMeta
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32/float16/bfloat16, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head_dim) dimension")
    total_q, num_q_heads, head_dim = q.shape
    num_slots, num_kv_heads, _ = k_cache.shape
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q's ({q.dtype})")
    if k_cache.shape[2] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[2]} != q head_dim {head_dim}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of k_cache heads ({num_kv_heads})")
    device = q.device
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("custom_mask", custom_mask)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q is on {device}")

    qo = _check_indptr(qo_indptr, "qo_indptr", device)
    kv = _check_indptr(kv_indptr, "kv_indptr", device)
    if len(qo) != len(kv):
        raise ValueError(f"qo_indptr has {len(qo)} entries, kv_indptr has {len(kv)}: both must be bs + 1")
    if qo[-1] != total_q:
        raise ValueError(f"qo_indptr[-1] = {qo[-1]} must equal q.shape[0] = {total_q}")
    if not isinstance(kv_indices, Tensor) or kv_indices.dim() != 1 or kv_indices.dtype not in _INDEX_DTYPES:
        raise ValueError("kv_indices must be a 1-D int32/int64 tensor")
    if kv_indices.device != device:
        raise ValueError(f"kv_indices is on {kv_indices.device}, q is on {device}")
    if kv[-1] > kv_indices.numel():
        raise ValueError(f"kv_indptr[-1] = {kv[-1]} exceeds kv_indices.numel() = {kv_indices.numel()}")
    used = kv_indices[: kv[-1]]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_slots):
        raise ValueError(f"kv_indices must lie in [0, k_cache.shape[0] = {num_slots})")

    qo_lens = tuple(b - a for a, b in itertools.pairwise(qo))
    kv_lens = tuple(b - a for a, b in itertools.pairwise(kv))
    if not isinstance(custom_mask, Tensor) or custom_mask.dim() != 1 or custom_mask.dtype != torch.bool:
        raise ValueError("custom_mask must be a 1-D bool tensor (flat FULL_MASK layout)")
    sizes = [n * k for n, k in zip(qo_lens, kv_lens, strict=True)]
    if custom_mask.numel() != sum(sizes):
        raise ValueError(f"custom_mask has {custom_mask.numel()} entries, expected sum(N_b * kv_len_b) = {sum(sizes)}")
    mask_indptr = torch.zeros(len(qo), dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)

    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not math.isfinite(scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    return TreeAttentionMeta(
        qo_lens=qo_lens,
        kv_lens=kv_lens,
        mask_indptr=mask_indptr.to(device),
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        sm_scale=scale,
    )


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    qo_indptr: Tensor,
    custom_mask: Tensor,
    sm_scale: float | None = None,
    backend: Backend = "auto",
) -> Tensor:
    """Attention of draft-tree queries over a token-slot KV cache with a custom mask.

    Request b's queries are ``q[qo_indptr[b]:qo_indptr[b+1]]`` (its ``N_b`` tree nodes);
    its keys/values are the cache rows ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
    (prefix slots, then its tree nodes' slots; ``kv_len_b`` of them); its mask is the
    row-major ``[N_b, kv_len_b]`` block of ``custom_mask`` (True = attend), blocks
    concatenated in request order (SGLang FULL_MASK, see :mod:`attention`).

    Parameters
    ----------
    q : Tensor
        ``[qo_indptr[-1], num_q_heads, head_dim]`` float32 / float16 / bfloat16.
    k_cache, v_cache : Tensor
        ``[num_slots, num_kv_heads, head_dim]``, q's dtype; ``num_q_heads`` is a
        multiple of ``num_kv_heads`` (query head h reads KV head ``h // group``).
    kv_indptr : Tensor
        ``[bs + 1]`` int32/int64.
    kv_indices : Tensor
        ``[>= kv_indptr[-1]]`` int32/int64 slot ids in ``[0, num_slots)``.
    qo_indptr : Tensor
        ``[bs + 1]`` int32/int64, ``qo_indptr[-1] == q.shape[0]``.
    custom_mask : Tensor
        ``[sum_b N_b * kv_len_b]`` bool.
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(head_dim)``.
    backend : {"auto", "triton", "torch"}
        "auto" is Triton for CUDA tensors when triton is installed, else torch.

    Returns
    -------
    Tensor
        ``[qo_indptr[-1], num_q_heads, head_dim]`` in q's dtype. A row whose mask has
        no True entry gets zeros.
    """
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    meta = check_tree_attention_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, qo_indptr, custom_mask, sm_scale)
    if backend == "auto":
        backend = "triton" if q.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        if not _triton_available():
            raise ImportError(
                "backend='triton' needs the optional package triton (pip install 'sglang-reanchor[triton]')"
            )
        from attention import triton_tree

        return triton_tree.run_checked(meta, q, k_cache, v_cache, kv_indptr, kv_indices, qo_indptr, custom_mask)
    from attention import reference

    return reference.run_checked(meta, q, k_cache, v_cache, kv_indptr, kv_indices, qo_indptr, custom_mask)


def _triton_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None
