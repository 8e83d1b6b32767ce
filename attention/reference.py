"""Torch implementation of tree-verify attention (the ``backend="torch"`` path).

Same contract as :func:`attention.tree_attention`: per request, gather the request's
K/V rows from the slot cache, compute dense masked softmax attention in float32 and
write the request's output rows. Loops over requests only; no Triton.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention.tree_attn import TreeAttentionMeta, check_tree_attention_inputs

__all__ = ["run_checked", "torch_tree_attention"]


def torch_tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    qo_indptr: Tensor,
    custom_mask: Tensor,
    sm_scale: float | None = None,
) -> Tensor:
    """Tree attention in torch; arguments, shapes and result as :func:`attention.tree_attention`.

    Returns
    -------
    Tensor
        ``[qo_indptr[-1], num_q_heads, head_dim]`` in q's dtype.
    """
    meta = check_tree_attention_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, qo_indptr, custom_mask, sm_scale)
    return run_checked(meta, q, k_cache, v_cache, kv_indptr, kv_indices, qo_indptr, custom_mask)


def run_checked(
    meta: TreeAttentionMeta,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    qo_indptr: Tensor,
    custom_mask: Tensor,
) -> Tensor:
    """Compute on inputs already validated into ``meta`` (see :func:`torch_tree_attention`)."""
    out = torch.zeros_like(q)
    q_start, kv_start, mask_start = 0, 0, 0
    for n, kv_len in zip(meta.qo_lens, meta.kv_lens, strict=True):
        if n and kv_len:
            slots = kv_indices[kv_start : kv_start + kv_len].long()
            qb = q[q_start : q_start + n].float()  # [N, Hq, D]
            kb = k_cache[slots].float().repeat_interleave(meta.group_size, dim=1)  # [L, Hq, D]
            vb = v_cache[slots].float().repeat_interleave(meta.group_size, dim=1)  # [L, Hq, D]
            allowed = custom_mask[mask_start : mask_start + n * kv_len].view(n, kv_len)  # [N, L]
            scores = torch.einsum("nhd,lhd->hnl", qb, kb) * meta.sm_scale  # [Hq, N, L]
            scores = scores.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows -> 0
            out[q_start : q_start + n] = torch.einsum("hnl,lhd->nhd", probs, vb).to(q.dtype)
        q_start, kv_start, mask_start = q_start + n, kv_start + kv_len, mask_start + n * kv_len
    return out
