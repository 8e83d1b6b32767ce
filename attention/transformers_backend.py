"""Run a Hugging Face model's attention through this package's tree-attention backends.

The reference engine verifies draft trees through the target's own attention with
a 4D tree mask. :func:`use_tree_attention` swaps that attention for this package's
backends, so the same engine runs the Triton kernel (GPU, or CPU under
``TRITON_INTERPRET=1``) or the torch reference::

    from attention.transformers_backend import use_tree_attention
    use_tree_attention(target_model, backend="triton")
    SpeculativeGenerator(target_model, drafter).generate(...)

Only tests use this (``tests/test_attention_engine.py``); the engine does not call it itself.

The HF cache holds one contiguous K/V run per request; it is handed to the kernel
as a slot cache (page size 1) whose request ``b`` owns slots ``b*kv .. b*kv+kv-1``,
and the 4D mask becomes the flat FULL_MASK layout. A 4D mask may be boolean
(True = attend) or additive (0 = attend, a large negative = blocked); no mask means
causal (prefill and one-token decode).

Plan once per forward, run per layer: the layer with ``layer_idx == 0`` plans
(:func:`attention.layout.plan_tree_attention`, the one host read); the later layers of the
same forward reuse its layout when they get the same mask object and the same shapes (a
module without ``layer_idx`` plans every call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attention.layout import TreeAttentionLayout, TreeAttentionSpec, plan_tree_attention
from attention.tree_attn import get_backend

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["BACKENDS", "TreeAttentionForward", "use_tree_attention"]

BACKENDS: tuple[str, ...] = ("torch", "triton")


class TreeAttentionForward:
    """HF attention-function signature over one backend, planning once per forward.

    ``query``: ``[bs, num_q_heads, q, head_dim]``; ``key``, ``value``:
    ``[bs, num_kv_heads, kv, head_dim]`` (the whole cache after this step);
    ``attention_mask``: ``[bs or 1, 1, q, kv]`` or None. A call returns
    ``([bs, q, num_q_heads, head_dim], None)``.
    """

    def __init__(self, backend: str = "torch") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
        self.backend = get_backend(backend)  # type: ignore[arg-type]
        self.plans = 0  # layouts planned so far (tests read it)
        self._key: tuple | None = None
        self._mask: Tensor | None = None  # the mask the cached layout was planned from (kept alive)
        self._layout: TreeAttentionLayout | None = None

    def layout(self, module: torch.nn.Module, query: Tensor, key: Tensor, attention_mask: Tensor | None,
               scaling: float | None) -> TreeAttentionLayout:
        """The layout of this call: planned at layer 0 (or on a new mask / new shapes), else reused."""
        bs, num_heads, q_len, head_dim = query.shape
        num_kv_heads, kv_len = key.shape[1], key.shape[2]
        cache_key = (bs, num_heads, num_kv_heads, q_len, kv_len, head_dim, scaling, query.device)
        reuse = (getattr(module, "layer_idx", 0) != 0 and self._layout is not None
                 and self._key == cache_key and self._mask is attention_mask)
        if reuse:
            assert self._layout is not None
            return self._layout
        dev = query.device
        if attention_mask is None:  # causal: query i sits at cache position kv - q + i
            cols = torch.arange(kv_len, device=dev)
            rows = torch.arange(q_len, device=dev) + (kv_len - q_len)
            allowed = (cols[None, :] <= rows[:, None]).expand(bs, q_len, kv_len)
        else:
            mask = attention_mask[..., :kv_len]
            allowed = mask if mask.dtype == torch.bool else mask == 0
            allowed = allowed.expand(bs, 1, q_len, kv_len)[:, 0]
        step = torch.arange(bs + 1, device=dev, dtype=torch.int32)
        spec = TreeAttentionSpec(
            qo_indptr=step * q_len, kv_indptr=step * kv_len,
            kv_indices=torch.arange(bs * kv_len, device=dev, dtype=torch.int32),
            custom_mask=allowed.reshape(-1), num_q_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, sm_scale=scaling)
        self._layout, self._key, self._mask = plan_tree_attention(spec), cache_key, attention_mask
        self.plans += 1
        return self._layout

    def __call__(self, module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                 attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                 **kwargs: Any) -> tuple[Tensor, None]:
        bs, num_heads, q_len, head_dim = query.shape
        num_kv_heads, kv_len = key.shape[1], key.shape[2]
        layout = self.layout(module, query, key, attention_mask, scaling)
        out = self.backend.run(
            layout,
            query.transpose(1, 2).reshape(bs * q_len, num_heads, head_dim),
            key.transpose(1, 2).reshape(bs * kv_len, num_kv_heads, head_dim),
            value.transpose(1, 2).reshape(bs * kv_len, num_kv_heads, head_dim),
        )
        return out.view(bs, q_len, num_heads, head_dim), None


def use_tree_attention(model: PreTrainedModel, backend: str = "torch") -> TreeAttentionForward:
    """Route every attention layer of ``model`` through a :class:`TreeAttentionForward` of ``backend``.

    Registers an HF attention implementation ``"reanchor_tree_<backend>"`` (a new one replaces
    the last) and selects it on ``model``. Returns the forward (its ``plans`` counts layouts).
    """
    forward = TreeAttentionForward(backend)
    from transformers import AttentionInterface

    name = f"reanchor_tree_{backend}"
    AttentionInterface.register(name, forward)
    model.set_attn_implementation(name)
    return forward
