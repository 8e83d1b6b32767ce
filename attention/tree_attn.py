"""Backend choice, and the one-shot call (plan + run) for callers that attend once per plan.

:func:`get_backend` turns a name into a :class:`attention.layout.TreeAttentionBackend`:
``"torch"`` (:class:`attention.reference.TorchTreeAttention`), ``"triton"``
(:class:`attention.triton_tree.TritonTreeAttention`, imported here only when asked for) or
``"auto"`` (Triton for CUDA devices when triton is installed, else torch).

A model forward plans once and runs per layer (see :mod:`attention.layout`)::

    layout = plan_tree_attention(TreeAttentionSpec(qo_indptr, kv_indptr, kv_indices, mask, 32, 8, 128))
    backend = get_backend("auto", layout.device)
    for layer in layers:
        out = backend.run(layout, q, k_cache, v_cache)

:func:`tree_attention` does both for one call (tests, one-off uses): it plans every time,
so it reads the indptrs on the host every time.

Imports run one way: ``layout`` <- ``reference`` / ``triton_tree`` <- this module.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
from torch import Tensor

from attention.layout import TreeAttentionBackend, TreeAttentionSpec, plan_tree_attention
from attention.reference import TorchTreeAttention

__all__ = ["BACKENDS", "Backend", "get_backend", "tree_attention"]

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def triton_available() -> bool:
    """Whether the optional package triton is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def get_backend(name: Backend, device: torch.device | str = "cpu") -> TreeAttentionBackend:
    """The backend called ``name`` for tensors on ``device``.

    Raises ``ValueError`` for an unknown name, ``ImportError`` for ``"triton"`` without triton.

    >>> get_backend("auto", "cpu").name
    'torch'
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    if name == "auto":
        name = "triton" if torch.device(device).type == "cuda" and triton_available() else "torch"
    if name == "torch":
        return TorchTreeAttention()
    if not triton_available():
        raise ImportError("backend='triton' needs the optional package triton (pip install 'sglang-reanchor[triton]')")
    from attention.triton_tree import TritonTreeAttention  # imports triton

    return TritonTreeAttention()


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
    """Plan and run once: :func:`plan_tree_attention` of the spec these arguments make, then ``run``.

    Arguments as the fields of :class:`~attention.layout.TreeAttentionSpec` and the tensors of
    :meth:`~attention.layout.TreeAttentionBackend.run`; the head counts and ``head_dim`` are
    read from ``q`` (``[qo_indptr[-1], num_q_heads, head_dim]``) and ``k_cache``
    (``[num_slots, num_kv_heads, head_dim]``).

    Returns
    -------
    Tensor
        ``[qo_indptr[-1], num_q_heads, head_dim]`` in q's dtype.
    """
    impl = get_backend(backend, q.device if isinstance(q, Tensor) else "cpu")
    for name, t in (("q", q), ("k_cache", k_cache)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor, got {getattr(t, 'shape', type(t))}")
    spec = TreeAttentionSpec(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                             custom_mask=custom_mask, num_q_heads=q.shape[1], num_kv_heads=k_cache.shape[1],
                             head_dim=q.shape[2], sm_scale=sm_scale)
    return impl.run(plan_tree_attention(spec), q, k_cache, v_cache)
