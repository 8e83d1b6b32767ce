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
other server changes. It serves REANCHOR's verify and draft forwards and plain decoding
with one padded SDPA call per layer for the whole batch (``torch_native`` loops over the
requests, one SDPA call each: at 16 requests that loop made a plain decode step slower
than REANCHOR's one-token verify of the same batch), and prefill with ``torch_native``'s
own loop.
Paged (page size > 1), translated (SWA, DCP) and cross-attention pools are refused
at construction or first use, with a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from torch.nn.functional import scaled_dot_product_attention

from attention.masks import unpack_full_mask

__all__ = ["NAME", "ReAnchorSdpaBackend", "create_backend"]

NAME = "reanchor_sdpa"


class ReAnchorSdpaBackend(TorchNativeAttnBackend):
    """``torch_native`` whose verify forwards honour the spec input's custom mask."""

    def __init__(self, model_runner: Any) -> None:
        super().__init__(model_runner)
        page_size = int(getattr(model_runner, "page_size", 1) or 1)
        if page_size != 1:
            raise ValueError(f"--attention-backend {NAME} supports --page-size 1 only, got {page_size}")
        if self.use_sliding_window_kv_pool:
            raise ValueError(f"--attention-backend {NAME} does not support sliding-window KV pools")
        self._plan: _VerifyPlan | None = None

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

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                       save_kv_cache: bool = True) -> torch.Tensor:
        """One decode token per request (``q`` ``[bs, H * D]``), all requests in one SDPA call: each
        attends to its ``seq_lens[b]`` cached tokens, the new one included (written first)."""
        window = getattr(layer, "sliding_window_size", None)
        if layer.is_cross_attention or (window is not None and window > -1):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        plan = self._decode_plan_for(forward_batch)
        bs = plan.cached.shape[0]
        query = q.reshape(bs, 1, heads, layer.qk_head_dim)
        keys = _gather(self.token_to_kv_pool.get_key_buffer(layer.layer_id), plan.cached, query.dtype)  # [bs, S, Hkv, D]
        values = _gather(self.token_to_kv_pool.get_value_buffer(layer.layer_id), plan.cached, query.dtype)
        out = scaled_dot_product_attention(
            query.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=None if plan.mask is None else plan.mask[:, None], scale=layer.scaling,
            enable_gqa=heads != kv_heads,
        )  # [bs, H, 1, Dv]
        return out.transpose(1, 2).reshape(bs, heads * layer.v_head_dim)

    def _decode_plan_for(self, forward_batch: Any) -> "_VerifyPlan":
        """The decode forward's slots and padding mask (``[bs, 1, S]``, ``S = max_b seq_lens[b]``),
        built at its first layer and reused by the others."""
        key = (forward_batch, forward_batch.seq_lens, forward_batch.req_pool_indices)
        plan = self._plan
        if plan is not None and len(plan.key) == len(key) and all(a is b for a, b in zip(plan.key, key)):
            return plan
        seq_lens = forward_batch.seq_lens.long()
        host_lens = forward_batch.seq_lens_cpu
        longest = int(host_lens.max()) if host_lens is not None else int(seq_lens.max())
        rows = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices.long(), :longest].long()
        seen = torch.arange(longest, device=rows.device)[None, :] < seq_lens[:, None]  # [bs, S]
        # requests of one length (one request, always) need no mask: SDPA runs faster without
        ragged = host_lens is None or bool((host_lens != longest).any())
        self._plan = _VerifyPlan(key=key, cached=rows.masked_fill(~seen, 0),
                                 mask=seen[:, None, :] if ragged else None, live=seen[:, :1])
        return self._plan

    def _verify(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                spec: Any) -> torch.Tensor:
        """``q``: ``[bs * n, H * D]`` (``n`` queries per request); returns ``[bs * n, H * Dv]``.

        One SDPA call for the whole batch: every request's cached keys are gathered into
        ``max_b s_b`` padded columns, its own ``n`` keys follow, and the padded mask
        (`_VerifyPlan`) hides the padding.
        """
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        n = int(spec.draft_token_num)
        plan = self._plan_for(forward_batch, spec, n)
        assert plan.mask is not None  # a verify plan always carries its tree mask
        bs = plan.cached.shape[0]
        query = q.view(bs, n, heads, layer.qk_head_dim)
        key_new = k.view(bs, n, kv_heads, layer.qk_head_dim)
        value_new = v.view(bs, n, kv_heads, layer.v_head_dim)
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        keys = torch.cat([_gather(k_cache, plan.cached, query.dtype), key_new.to(query.dtype)], dim=1)  # [bs, S+n, Hkv, D]
        values = torch.cat([_gather(v_cache, plan.cached, query.dtype), value_new.to(query.dtype)], dim=1)
        out = scaled_dot_product_attention(
            query.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=plan.mask[:, None], scale=layer.scaling, enable_gqa=heads != kv_heads,
        ).transpose(1, 2)  # [bs, n, H, Dv]
        out = torch.where(plan.live[:, :, None, None], out, 0.0)  # SDPA gives NaN on rows with no key
        return out.reshape(q.shape[0], heads * layer.v_head_dim)

    def _plan_for(self, forward_batch: Any, spec: Any, n: int) -> "_VerifyPlan":
        """The forward's `_VerifyPlan`, built at its first layer and reused by the others."""
        mask = spec.custom_mask
        key = (forward_batch, mask, forward_batch.seq_lens, forward_batch.req_pool_indices)
        plan = self._plan
        if plan is not None and len(plan.key) == len(key) and all(a is b for a, b in zip(plan.key, key)):
            # the same forward, the same tensors
            return plan
        # the cached lengths (seq_lens_cpu may already count the queries)
        seq_lens = forward_batch.seq_lens.long()
        max_prefix = int(seq_lens.max()) if seq_lens.numel() else 0
        rows = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices.long(), :max_prefix].long()
        padding = torch.arange(max_prefix, device=rows.device)[None, :] >= seq_lens[:, None]
        padded = unpack_full_mask(mask, seq_lens, n, max_prefix)  # [bs, n, S + n]; checks the mask's size
        self._plan = _VerifyPlan(key=key,
                                 cached=rows.masked_fill(padding, 0), mask=padded, live=padded.any(dim=2))
        return self._plan


def _gather(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cache[slots]`` (``[P, Hkv, D]`` by ``[bs, S]`` -> ``[bs, S, Hkv, D]``) in ``dtype``.

    ``index_select`` copies whole rows; advanced indexing with a 2-D index goes element by
    element and was 1.8-4.1x slower on a Zen 3 (float32, 3 KV heads of 64, 1-16 requests of up
    to 300 tokens: `scripts/cpu_attention_bench.py`)."""
    rows = cache.index_select(0, slots.reshape(-1))
    return rows.view(*slots.shape, *cache.shape[1:]).to(dtype)


@dataclass(frozen=True)
class _VerifyPlan:
    """What every layer of one verify forward shares.

    ``cached`` ``[bs, S]``: KV-pool slots of each request's cached tokens, padded with
    slot 0 past ``s_b`` (``S = max_b s_b``); ``mask`` ``[bs, n, S + n]`` bool (padding
    False; a decode plan's is None when every request has the same length); ``live``
    ``[bs, n]``: rows that see at least one key. ``key`` holds the forward batch and its
    tensors (compared by identity), so a plan is reused only within that forward; holding
    them, it also keeps their ids from being reused.
    """

    key: tuple
    cached: torch.Tensor
    mask: torch.Tensor | None
    live: torch.Tensor


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
