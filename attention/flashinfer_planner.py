"""Run tree-verify attention with FlashInfer's paged prefill kernel (page size 1).

:class:`FlashInferTreeAttention` follows FlashInfer's lifecycle: ``plan(batch)`` does the
host work once per batch (builds :class:`attention.plan.TreePlan` and calls
``BatchPrefillWithPagedKVCacheWrapper.plan``), ``run(q, k_cache, v_cache)`` is
device-only and is called once per layer. ``flashinfer`` is imported in ``__init__``,
never at module import, so this module loads on machines without it.

The mask goes to ``plan`` as the flat bool ``custom_mask`` (FlashInfer packs it with
``segment_packbits(..., bitorder="little")``, byte-offset ``mask_indptr``); the
pre-packed form is not passed because ``plan(packed_custom_mask=...)`` in flashinfer
0.7.2 keeps ``mask_indptr`` in bits, which is wrong for bs > 1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attention.plan import TreeBatch, TreePlan, plan_tree_batch

__all__ = ["FlashInferTreeAttention"]


class FlashInferTreeAttention:
    """Tree-verify attention on FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper``.

    Parameters
    ----------
    workspace_buffer : Tensor
        uint8 scratch on the target CUDA device (FlashInfer recommends 128 MiB).
    num_q_heads, num_kv_heads, head_dim : int
        Attention geometry, fixed for the wrapper's life.
    dtype : torch.dtype
        q / KV cache dtype (float16 or bfloat16 for FlashInfer's FA2 kernels).
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(head_dim)``.
    """

    def __init__(
        self,
        workspace_buffer: Tensor,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float | None = None,
    ) -> None:
        try:
            import flashinfer
        except ImportError as exc:  # pragma: no cover - exercised only without flashinfer
            raise ImportError("FlashInferTreeAttention needs the optional package flashinfer-python") from exc
        if workspace_buffer.dtype != torch.uint8 or not workspace_buffer.is_cuda:
            raise ValueError("workspace_buffer must be a uint8 CUDA tensor")
        if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
            raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.device = workspace_buffer.device
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.sm_scale = sm_scale
        self._wrapper: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace_buffer, "NHD")
        self._plan: TreePlan | None = None

    def plan(self, batch: TreeBatch) -> TreePlan:
        """Build the page-size-1 metadata for ``batch`` and plan FlashInfer with it.

        Parameters
        ----------
        batch : TreeBatch
            Trees, prefix lengths and KV slots (any device; moved to the wrapper's).

        Returns
        -------
        TreePlan
            The arrays handed to ``plan()`` (on the wrapper's device).
        """
        plan = plan_tree_batch(batch)
        plan = TreePlan(**{name: getattr(plan, name).to(self.device) for name in plan.__dataclass_fields__})
        self._wrapper.plan(
            plan.qo_indptr,
            plan.kv_indptr,
            plan.kv_indices,
            plan.kv_last_page_len,
            self.num_q_heads,
            self.num_kv_heads,
            self.head_dim,
            1,  # page_size
            custom_mask=plan.custom_mask,
            causal=False,
            sm_scale=self.sm_scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._plan = plan
        return plan

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """Attention for the planned batch.

        Parameters
        ----------
        q : Tensor
            ``[qo_indptr[-1], num_q_heads, head_dim]``.
        k_cache, v_cache : Tensor
            ``[num_slots, num_kv_heads, head_dim]`` token-slot caches.

        Returns
        -------
        Tensor
            ``[qo_indptr[-1], num_q_heads, head_dim]`` in q's dtype.
        """
        if self._plan is None:
            raise RuntimeError("call plan(batch) before run()")
        if q.shape[1:] != (self.num_q_heads, self.head_dim) or q.dtype != self.dtype:
            raise ValueError(
                f"q must be [*, {self.num_q_heads}, {self.head_dim}] {self.dtype}, got {q.dtype} {tuple(q.shape)}"
            )
        if k_cache.shape[1:] != (self.num_kv_heads, self.head_dim) or v_cache.shape != k_cache.shape:
            raise ValueError(f"k_cache/v_cache must be [num_slots, {self.num_kv_heads}, {self.head_dim}]")
        # Page size 1, NHD: [num_pages, page_size = 1, num_kv_heads, head_dim].
        return self._wrapper.run(q, (k_cache.unsqueeze(1), v_cache.unsqueeze(1)))
