"""Torch tree attention (the ``"torch"`` backend): the reference the Triton and FlashInfer kernels are checked against.

Per request, gather its K/V rows from the slot cache and compute dense masked softmax
attention in float32. The loop runs over the requests of the batch (host ints from the
layout), never over nodes; nothing is read from the device. No Triton.

>>> import torch
>>> from attention.layout import TreeAttentionSpec, plan_tree_attention
>>> spec = TreeAttentionSpec(qo_indptr=torch.tensor([0, 2]), kv_indptr=torch.tensor([0, 3]),
...                          kv_indices=torch.tensor([0, 1, 2]), custom_mask=torch.ones(6, dtype=torch.bool),
...                          num_q_heads=2, num_kv_heads=1, head_dim=16)
>>> q, k = torch.randn(2, 2, 16), torch.randn(3, 1, 16)
>>> TorchTreeAttention().run(plan_tree_attention(spec), q, k, k).shape
torch.Size([2, 2, 16])
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention.layout import TreeAttentionLayout, check_out, check_run_inputs

__all__ = ["TorchTreeAttention"]


class TorchTreeAttention:
    """The torch backend (:class:`attention.layout.TreeAttentionBackend`)."""

    name = "torch"

    def run(self, layout: TreeAttentionLayout, q: Tensor, k_cache: Tensor, v_cache: Tensor,
            out: Tensor | None = None) -> Tensor:
        """See :meth:`attention.layout.TreeAttentionBackend.run`."""
        check_run_inputs(layout, q, k_cache, v_cache)
        out = check_out(q, out)
        if out is None:
            out = torch.zeros_like(q)  # [total_q, Hq, D]
        else:
            out.zero_()
        q_start, kv_start, mask_start = 0, 0, 0
        for n, kv_len in zip(layout.qo_lens, layout.kv_lens, strict=True):
            if n and kv_len:
                slots = layout.kv_indices[kv_start : kv_start + kv_len].long()
                qb = q[q_start : q_start + n].float()  # [N, Hq, D]
                kb = k_cache[slots].float().repeat_interleave(layout.group_size, dim=1)  # [L, Hq, D]
                vb = v_cache[slots].float().repeat_interleave(layout.group_size, dim=1)  # [L, Hq, D]
                allowed = layout.custom_mask[mask_start : mask_start + n * kv_len].view(n, kv_len)  # [N, L]
                scores = torch.einsum("nhd,lhd->hnl", qb, kb) * layout.sm_scale  # [Hq, N, L]
                scores = scores.masked_fill(~allowed, float("-inf"))
                probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows -> 0
                out[q_start : q_start + n] = torch.einsum("hnl,lhd->nhd", probs, vb).to(q.dtype)
            q_start, kv_start, mask_start = q_start + n, kv_start + kv_len, mask_start + n * kv_len
        return out
