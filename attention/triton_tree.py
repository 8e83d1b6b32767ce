"""Triton tree attention over a token-slot KV cache (the ``"triton"`` backend).

Imports triton at module level, so only import this module when Triton is wanted:
:func:`attention.tree_attn.get_backend` does so lazily and the :mod:`attention` package never
does. On CPU the kernels run only under ``TRITON_INTERPRET=1`` set before this module
is first imported. Only the GPU check (``scripts/gpu_check*.py``) and the tests run it; the
engine and the SGLang worker do not.

Algorithm (FlashAttention-2 style online softmax, one pass over the keys):

* One program per (request b, block of BLOCK_M query rows, KV head, KV split). The
  rows of a block are (tree node, query head of the GQA group) pairs,
  ``row = node * GROUP + g``, so each K/V tile is loaded once per group.
* K/V rows are gathered through ``kv_indices`` (page size 1); the mask bit of
  (node i, key j) is ``custom_mask[mask_indptr[b] + i * kv_len_b + j]``.
* With ``NUM_SPLITS > 1`` each program covers a slice of the keys and writes an
  unnormalised partial output plus its (max, sum); a second kernel merges the splits
  (flash-decoding), which keeps the GPU busy for small batches with long prefixes.
* Scores are kept in the log2 domain (``sm_scale * log2(e)``); rows with no visible
  key produce zeros.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from attention.layout import TreeAttentionLayout, check_out, check_run_inputs

__all__ = ["TritonTreeAttention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _tree_attn_fwd_kernel(
    q_ptr,  # [total_q, num_q_heads, head_dim]
    k_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_ptr,  # [num_slots, num_kv_heads, head_dim]
    qo_indptr_ptr,  # [bs + 1] int32/int64
    kv_indptr_ptr,  # [bs + 1] int32/int64
    kv_indices_ptr,  # [kv_indptr[-1]] int32/int64 slot ids
    mask_ptr,  # [sum_b N_b * kv_len_b] uint8 (the bool mask's bytes), row-major per request
    mask_indptr_ptr,  # [bs + 1] int64 offsets of each request's mask block
    out_ptr,  # [total_q, num_q_heads, head_dim] q dtype, or f32 partials [NUM_SPLITS, total_q, num_q_heads, HEAD_DIM]
    ml_ptr,  # [NUM_SPLITS, total_q, num_q_heads, 2] fp32 (running max in log2 units, sum); unused if NUM_SPLITS == 1
    sm_scale_log2,
    total_q,
    num_q_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,  # upcast dot operands (the CPU interpreter's dot mishandles bf16)
):
    b = tl.program_id(0)
    m_blk = tl.program_id(1)
    kv_head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(qo_indptr_ptr + b).to(tl.int64)
    n_q = tl.load(qo_indptr_ptr + b + 1).to(tl.int64) - q_start
    if m_blk * BLOCK_M >= n_q * GROUP:
        return
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start
    mask_start = tl.load(mask_indptr_ptr + b).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)

    rows = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] = node * GROUP + g
    node = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = node < n_q
    q_tok = q_start + node
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions within the request
        col_ok = cols < hi
        slots = tl.load(kv_indices_ptr + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + slots[None, :] * stride_kt + kv_head * stride_kh + d[:, None],
            mask=d_ok[:, None] & col_ok[None, :],
            other=0.0,
        )  # [BLOCK_D, BLOCK_N]
        if DOT_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_M, BLOCK_N]
        allowed = tl.load(
            mask_ptr + mask_start + node[:, None] * kv_len + cols[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0,
        )
        s = tl.where(allowed != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-masked so far: keep exp2 finite
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
            mask=col_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        if DOT_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part_row = (split * total_q + q_tok) * num_q_heads + head  # [BLOCK_M] int64
        tl.store(out_ptr + part_row[:, None] * HEAD_DIM + d[None, :], acc, mask=out_mask)
        tl.store(ml_ptr + part_row * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + part_row * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _tree_attn_merge_kernel(
    part_ptr,  # [NUM_SPLITS, total_q, num_q_heads, HEAD_DIM] fp32 unnormalised partial outputs
    ml_ptr,  # [NUM_SPLITS, total_q, num_q_heads, 2] fp32 (max in log2 units, sum)
    out_ptr,  # [total_q, num_q_heads, head_dim] q dtype
    total_q,
    num_q_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < NUM_SPLITS
    part_row = (s * total_q + t) * num_q_heads + h  # [BLOCK_S]
    m_s = tl.load(ml_ptr + part_row * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + part_row * 2 + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m_s, 0)
    w = tl.math.exp2(m_s - tl.where(m_max == float("-inf"), 0.0, m_max))  # [BLOCK_S]
    l_tot = tl.sum(w * l_s, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    acc = tl.load(part_ptr + part_row[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / tl.where(l_tot > 0, l_tot, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _default_splits(layout: TreeAttentionLayout, q: Tensor, m_blocks: int, block_n: int) -> int:
    if not q.is_cuda or layout.batch_size == 0:
        return 1
    programs = layout.batch_size * m_blocks * layout.num_kv_heads
    target = 2 * _sm_count(q.device.index or 0)
    if programs >= target:
        return 1
    max_useful = max(1, max(layout.kv_lens) // (4 * block_n))  # >= 4 key tiles per split
    splits = min(triton.cdiv(target, programs), max_useful, 64)
    return 1 << (splits.bit_length() - 1)  # power of two: few kernel variants


class TritonTreeAttention:
    """The Triton backend (:class:`attention.layout.TreeAttentionBackend`).

    Parameters
    ----------
    num_kv_splits : int, optional
        Key-dimension splits (merged by a second kernel). Default: 1 on CPU, chosen
        from the SM count and the longest ``kv_len`` on GPU.
    block_m, block_n : int, optional
        Tile sizes (powers of two >= 16) over (node, head) rows and keys.
    """

    name = "triton"

    def __init__(self, num_kv_splits: int | None = None, block_m: int | None = None,
                 block_n: int | None = None) -> None:
        if num_kv_splits is not None and num_kv_splits < 1:
            raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
        for name, value in (("block_m", block_m), ("block_n", block_n)):
            if value is not None and (value < 16 or value & (value - 1)):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        self.num_kv_splits, self.block_m, self.block_n = num_kv_splits, block_m, block_n

    def run(self, layout: TreeAttentionLayout, q: Tensor, k_cache: Tensor, v_cache: Tensor,
            out: Tensor | None = None) -> Tensor:
        """See :meth:`attention.layout.TreeAttentionBackend.run`."""
        check_run_inputs(layout, q, k_cache, v_cache)
        return _launch(layout, q, k_cache, v_cache, check_out(q, out),
                       self.num_kv_splits, self.block_m, self.block_n)


def _launch(layout: TreeAttentionLayout, q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor | None,
            num_kv_splits: int | None, block_m: int | None, block_n: int | None) -> Tensor:
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported")
    if out is None:
        out = torch.empty_like(q)  # [total_q, num_q_heads, head_dim]
    total_q = q.shape[0]
    if total_q == 0:
        return out
    group = layout.group_size
    max_rows = max(layout.qo_lens) * group
    block_m = block_m or min(64, max(16, triton.next_power_of_2(max_rows)))
    block_n = block_n or (64 if q.is_cuda else 16)
    block_d = max(16, triton.next_power_of_2(layout.head_dim))
    m_blocks = triton.cdiv(max_rows, block_m)
    splits = num_kv_splits or _default_splits(layout, q, m_blocks, block_n)
    if splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {splits}")
    mask_bytes = layout.custom_mask.contiguous().view(torch.uint8)
    if splits == 1:
        target, ml = out, out  # ml unused
        stride_ot, stride_oh = out.stride(0), out.stride(1)
    else:
        target = torch.empty(splits, total_q, layout.num_q_heads, layout.head_dim, dtype=torch.float32, device=q.device)
        ml = torch.empty(splits, total_q, layout.num_q_heads, 2, dtype=torch.float32, device=q.device)
        stride_ot, stride_oh = 0, 0  # partials are indexed densely
    grid = (layout.batch_size, m_blocks, layout.num_kv_heads * splits)
    extra = {"num_warps": 4, "num_stages": 2} if q.is_cuda else {}
    _tree_attn_fwd_kernel[grid](
        q,
        k_cache,
        v_cache,
        layout.qo_indptr,
        layout.kv_indptr,
        layout.kv_indices,
        mask_bytes,
        layout.mask_indptr,
        target,
        ml,
        layout.sm_scale * _LOG2E,
        total_q,
        layout.num_q_heads,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        stride_ot,
        stride_oh,
        GROUP=group,
        HEAD_DIM=layout.head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        DOT_FP32=q.dtype == torch.bfloat16 and not q.is_cuda,
        **extra,
    )
    if splits > 1:
        _tree_attn_merge_kernel[(total_q, layout.num_q_heads)](
            target,
            ml,
            out,
            total_q,
            layout.num_q_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=layout.head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=splits,
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
        )
    return out
