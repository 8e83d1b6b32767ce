"""``--attention-backend reanchor_sdpa``: torch SDPA on SGLang's KV pool, with speculative custom masks.

SGLang's ``torch_native`` backend serves prefill and decode on CPU with
``scaled_dot_product_attention`` but runs a verify forward causally: it ignores
the FULL_MASK that a draft tree (or DFlash's draft window) needs. The only CPU
path that honours it is the Triton backend under ``TRITON_INTERPRET=1``, about
100x slower. This backend is ``torch_native`` plus one thing: a
``TARGET_VERIFY`` forward attends with the batch's custom mask.

Layout (SGLang's FULL_MASK, as the Triton and FlashInfer backends read it): request
``b`` has ``s_b = seq_lens[b]`` cached tokens and ``q`` query tokens (the spec
input's ``draft_token_num``); its mask is ``q x (s_b + q)`` booleans, row-major,
``True`` = attend, and the requests' masks are concatenated. Keys and values are
the cached ``req_to_token[b, :s_b]`` rows followed by the queries' own.

The plugin registers it for every server (`plugin.register`): a new choice, no
other server changes. It serves REANCHOR's verify and draft forwards and plain
decoding alike; with one request per loop iteration, as ``torch_native`` does.
Paged (page size > 1), translated (SWA, DCP) and cross-attention pools are refused
at construction or first use, with a message.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from torch.nn.functional import scaled_dot_product_attention

__all__ = ["NAME", "ReAnchorSdpaBackend", "create_backend", "masked_attention"]

NAME = "reanchor_sdpa"


def masked_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     scale: float | None) -> torch.Tensor:
    """One request's attention: ``query`` ``[q, H, D]``, ``keys``/``values`` ``[k, Hkv, D]``, ``mask`` ``[q, k]``.

    Returns ``[q, H, Dv]``. A row with no True column (a padding node) attends to
    nothing useful; SDPA would return NaN there, so such rows get zeros.
    """
    if keys.dtype != query.dtype:
        keys, values = keys.to(query.dtype), values.to(query.dtype)
    out = scaled_dot_product_attention(
        query.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=mask[None, None], scale=scale, enable_gqa=query.shape[1] != keys.shape[1],
    )[0].transpose(0, 1)
    return torch.where(mask.any(dim=1)[:, None, None], out, 0.0)


class ReAnchorSdpaBackend(TorchNativeAttnBackend):
    """``torch_native`` whose verify forwards honour the spec input's custom mask."""

    def __init__(self, model_runner: Any) -> None:
        super().__init__(model_runner)
        page_size = int(getattr(model_runner, "page_size", 1) or 1)
        if page_size != 1:
            raise ValueError(f"--attention-backend {NAME} supports --page-size 1 only, got {page_size}")
        if self.use_sliding_window_kv_pool:
            raise ValueError(f"--attention-backend {NAME} does not support sliding-window KV pools")

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                       save_kv_cache: bool = True) -> torch.Tensor:
        spec = forward_batch.spec_info
        if not forward_batch.forward_mode.is_target_verify() or getattr(spec, "custom_mask", None) is None:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if layer.is_cross_attention:
            raise NotImplementedError(f"{NAME}: cross-attention in a verify forward")
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        return self._verify(q, k, v, layer, forward_batch, spec)

    def _verify(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                spec: Any) -> torch.Tensor:
        """``q``: ``[bs * n, H * D]`` (``n`` queries per request); returns ``[bs * n, H * Dv]``."""
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        query = q.view(-1, heads, layer.qk_head_dim)
        key_new = k.view(-1, kv_heads, layer.qk_head_dim)
        value_new = v.view(-1, kv_heads, layer.v_head_dim)
        n = int(spec.draft_token_num)
        # the cached lengths (seq_lens_cpu may already count the queries); one SDPA call per request
        seq_lens = forward_batch.seq_lens.tolist()
        mask = spec.custom_mask
        expected = sum(n * (s + n) for s in seq_lens)
        if mask.numel() != expected:
            raise ValueError(f"{NAME}: custom_mask has {mask.numel()} entries, the batch's FULL_MASK needs {expected}")
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        out = query.new_empty(query.shape[0], heads, layer.v_head_dim)
        offset = 0
        for b, s in enumerate(seq_lens):
            rows = slice(b * n, (b + 1) * n)
            cached = req_to_token[forward_batch.req_pool_indices[b], :s].long()
            keys = torch.cat([k_cache[cached].to(key_new.dtype), key_new[rows]])
            values = torch.cat([v_cache[cached].to(value_new.dtype), value_new[rows]])
            width = n * (s + n)
            out[rows] = masked_attention(query[rows], keys, values, mask[offset: offset + width].view(n, s + n).bool(),
                                         layer.scaling)
            offset += width
        return out.view(q.shape[0], heads * layer.v_head_dim)


def create_backend(runner: Any) -> ReAnchorSdpaBackend:
    """SGLang's attention-backend factory signature (``attention_registry``)."""
    if getattr(runner, "use_mla_backend", False):
        raise ValueError(f"--attention-backend {NAME} does not support MLA models")
    return ReAnchorSdpaBackend(runner)


def register() -> None:
    """Add ``reanchor_sdpa`` to SGLang's attention-backend choices (target and draft) and registry."""
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        DRAFT_ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
        add_draft_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    if NAME not in DRAFT_ATTENTION_BACKEND_CHOICES:
        add_draft_attention_backend_choices([NAME])
    ATTENTION_BACKENDS.setdefault(NAME, create_backend)
