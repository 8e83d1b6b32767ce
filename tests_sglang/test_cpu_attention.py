"""The plugin's CPU attention backend (``--attention-backend reanchor_sdpa``).

End to end it is the default of every REANCHOR server in these tests; here: its
per-request kernel against a dense softmax written out, and its registration.
The server tests compare it with SGLang's Triton kernels
(`test_serving_cpu.py::test_reanchor_in_sglang_matches_the_reference_engine`).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.srt.cpu_attention import NAME, masked_attention


def dense(query, keys, values, mask, scale):
    """Softmax attention over the True columns, one head at a time (GQA: head h reads kv head h // group)."""
    q, heads, _ = query.shape
    group = heads // keys.shape[1]
    out = torch.zeros(q, heads, values.shape[-1], dtype=torch.float64)
    for h in range(heads):
        scores = (query[:, h].double() @ keys[:, h // group].double().T) * scale
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[:, h] = weights @ values[:, h // group].double()
    return out


@settings(max_examples=60, deadline=None)
@given(q=st.integers(1, 9), prefix=st.integers(0, 12), kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**16))
def test_masked_attention_is_softmax_over_the_allowed_columns(q, prefix, kv_heads, group, seed):
    gen = torch.Generator().manual_seed(seed)
    heads, dim = kv_heads * group, 8
    query = torch.randn(q, heads, dim, generator=gen)
    keys = torch.randn(prefix + q, kv_heads, dim, generator=gen)
    values = torch.randn(prefix + q, kv_heads, dim, generator=gen)
    mask = torch.rand(q, prefix + q, generator=gen) < 0.6
    mask[0] = False  # a row that sees nothing (a padding node) gets zeros, not NaN
    got = masked_attention(query, keys, values, mask, scale=dim ** -0.5)
    torch.testing.assert_close(got.double(), dense(query, keys, values, mask, dim ** -0.5), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()


def test_registered_as_an_attention_backend_choice():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, DRAFT_ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_reanchor.srt.plugin import register

    register()
    assert NAME in ATTENTION_BACKEND_CHOICES and NAME in DRAFT_ATTENTION_BACKEND_CHOICES
    assert NAME in ATTENTION_BACKENDS


@pytest.mark.parametrize("heads", [(4, 2), (9, 3)])
def test_torch_qk_norm_rope_equals_sglangs_triton_kernel(heads):
    """The plain-CPU replacement of the drafter's fused QK-RMSNorm + RoPE kernel
    (`cpu_compat._table_qk_norm_rope_torch`) against SGLang's Triton kernel in the interpreter."""
    from sglang.kernels.ops.attention.table_qk_norm_rope import table_qk_norm_rope_

    from sglang_reanchor.srt.cpu_compat import _table_qk_norm_rope_torch

    hq, hk = heads
    d, t = 64, 7
    g = torch.Generator().manual_seed(hq)
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(torch.bfloat16)
    positions = torch.tensor([0, 3, 5, 40, 41, 2, 100])
    q_w, k_w = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16), (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16)
    angles = torch.arange(128)[:, None] * (10000 ** (-torch.arange(0, d, 2) / d))[None]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [max_pos, D], SGLang's table layout
    want, got = qkv.clone(), qkv.clone()
    table_qk_norm_rope_(want, positions, q_w, k_w, cos_sin, hq, hk, d, 1e-6)
    _table_qk_norm_rope_torch(None, got, positions, q_w, k_w, cos_sin, hq, hk, d, 1e-6)
    assert torch.equal(got[:, (hq + hk) * d:], qkv[:, (hq + hk) * d:])  # V untouched
    assert not torch.equal(got, qkv)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
