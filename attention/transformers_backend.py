"""Run a Hugging Face model's attention through :func:`attention.tree_attention`.

The reference engine verifies draft trees through the target's own attention with
a 4D tree mask. :func:`use_tree_attention` swaps that attention for this package's
kernels, so the same engine runs the Triton kernel (GPU, or CPU under
``TRITON_INTERPRET=1``) or the torch reference::

    from attention.transformers_backend import use_tree_attention
    use_tree_attention(target_model, backend="triton")
    SpeculativeGenerator(target_model, drafter).generate(...)

The HF cache holds one contiguous K/V run per request; it is handed to the kernel
as a slot cache (page size 1) whose request ``b`` owns slots ``b*kv .. b*kv+kv-1``,
and the 4D mask becomes the flat FULL_MASK layout. A 4D mask may be boolean
(True = attend) or additive (0 = attend, a large negative = blocked); no mask means
causal (prefill and one-token decode).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attention.tree_attn import tree_attention

__all__ = ["BACKENDS", "tree_attention_forward", "use_tree_attention"]

BACKENDS: tuple[str, ...] = ("torch", "triton")


def tree_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    backend: str = "torch",
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """HF attention-function signature over :func:`attention.tree_attention`.

    ``query``: ``[bs, num_q_heads, q, head_dim]``; ``key``, ``value``:
    ``[bs, num_kv_heads, kv, head_dim]`` (the whole cache after this step);
    ``attention_mask``: ``[bs or 1, 1, q, kv]`` or None. Returns
    ``([bs, q, num_q_heads, head_dim], None)``.
    """
    bs, num_heads, q_len, head_dim = query.shape
    num_kv_heads, kv_len = key.shape[1], key.shape[2]
    dev = query.device
    if attention_mask is None:  # causal: query i sits at cache position kv - q + i
        cols = torch.arange(kv_len, device=dev)
        rows = torch.arange(q_len, device=dev) + (kv_len - q_len)
        allowed = (cols[None, :] <= rows[:, None]).expand(bs, q_len, kv_len)
    else:
        mask = attention_mask[..., :kv_len]
        allowed = mask if mask.dtype == torch.bool else mask == 0
        allowed = allowed.expand(bs, 1, q_len, kv_len)[:, 0]
    step = lambda n: torch.arange(bs + 1, device=dev, dtype=torch.int32) * n
    out = tree_attention(
        query.transpose(1, 2).reshape(bs * q_len, num_heads, head_dim),
        key.transpose(1, 2).reshape(bs * kv_len, num_kv_heads, head_dim),
        value.transpose(1, 2).reshape(bs * kv_len, num_kv_heads, head_dim),
        kv_indptr=step(kv_len),
        kv_indices=torch.arange(bs * kv_len, device=dev, dtype=torch.int32),
        qo_indptr=step(q_len),
        custom_mask=allowed.reshape(-1),
        sm_scale=scaling,
        backend=backend,
    )
    return out.view(bs, q_len, num_heads, head_dim), None


def use_tree_attention(model: torch.nn.Module, backend: str = "torch") -> str:
    """Route every attention layer of ``model`` through :func:`attention.tree_attention`.

    Registers (once) an HF attention implementation ``"reanchor_tree_<backend>"`` and
    selects it on ``model``. Returns the implementation's name.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    from transformers import AttentionInterface

    name = f"reanchor_tree_{backend}"

    def forward(*args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        return tree_attention_forward(*args, backend=backend, **kwargs)

    AttentionInterface.register(name, forward)
    model.set_attn_implementation(name)
    return name
