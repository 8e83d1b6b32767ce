"""The plugin's CPU attention backend (``--attention-backend reanchor_sdpa``).

End to end it is the default of every REANCHOR server in these tests; here: its
batched verify attention (on SGLang's own KV pools) against a dense softmax
written out per request, and its registration.
The server tests compare it with SGLang's Triton kernels
(`test_serving_cpu.py::test_reanchor_in_sglang_matches_the_reference_engine`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sglang_reanchor.srt.cpu_attention import NAME


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


def verify_forward(prefixes, n, kv_heads, group, seed, dim=8):
    """One TARGET_VERIFY attention call of `ReAnchorSdpaBackend` on SGLang's own pools.

    Request ``b`` has ``prefixes[b]`` cached tokens at scattered pool slots and ``n``
    queries with a random FULL_MASK. Returns ``(got [bs, n, H, D], want [bs, n, H, D] float64)``.
    """
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from attention.masks import full_mask
    from sglang_reanchor.srt.cpu_attention import ReAnchorSdpaBackend

    gen = torch.Generator().manual_seed(seed)
    bs, heads = len(prefixes), kv_heads * group
    context, pool_size = max(prefixes) + n + 3, 4 * (sum(prefixes) + bs * n) + 8
    req_pool = ReqToTokenPool(size=bs + 2, max_context_len=context, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(size=pool_size, page_size=1, dtype=torch.float32, head_num=kv_heads, head_dim=dim,
                               layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, page_size=1)
    backend = ReAnchorSdpaBackend(runner)
    layer = RadixAttention(heads, dim, dim ** -0.5, kv_heads, layer_id=0)

    slots = torch.randperm(pool_size - 1, generator=gen)[: sum(prefixes) + bs * n] + 1  # slot 0 is SGLang's pad
    rows = torch.randperm(bs + 1, generator=gen)[:bs] + 1
    k_cache, v_cache = kv_pool.get_key_buffer(0), kv_pool.get_value_buffer(0)
    k_cache.copy_(torch.randn(k_cache.shape, generator=gen))
    v_cache.copy_(torch.randn(v_cache.shape, generator=gen))
    tails = torch.rand(bs, n, n, generator=gen) < 0.6
    tails[:, 0] = False  # a query that sees none of its own block (with no prefix: no key at all, zeros)
    prefix_lens = torch.tensor(prefixes)
    flat = full_mask(tails, prefix_lens)
    used, new_loc = 0, []
    for b, s in enumerate(prefixes):
        req_pool.req_to_token[rows[b], : s + n] = slots[used: used + s + n].int()
        new_loc.append(slots[used + s: used + s + n])
        used += s + n
    query = torch.randn(bs * n, heads * dim, generator=gen)
    key = torch.randn(bs * n, kv_heads * dim, generator=gen)
    value = torch.randn(bs * n, kv_heads * dim, generator=gen)
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=prefix_lens.clone(),
                            req_pool_indices=rows, out_cache_loc=torch.cat(new_loc),
                            spec_info=SimpleNamespace(custom_mask=flat.to(torch.uint8), draft_token_num=n))
    # as RadixAttention hands them over: q flat, k and v per kv head
    got = backend.forward_extend(query, key.view(-1, kv_heads, dim), value.view(-1, kv_heads, dim), layer, batch)
    got = got.view(bs, n, heads, dim)
    assert torch.equal(k_cache[batch.out_cache_loc], key.view(-1, kv_heads, dim))  # the new keys are cached

    want = torch.zeros(bs, n, heads, dim, dtype=torch.float64)
    offset = 0
    for b, s in enumerate(prefixes):
        cached = req_pool.req_to_token[rows[b], :s].long()
        keys = torch.cat([k_cache[cached], key.view(bs, n, kv_heads, dim)[b]])
        values = torch.cat([v_cache[cached], value.view(bs, n, kv_heads, dim)[b]])
        mask = flat[offset: offset + n * (s + n)].view(n, s + n)
        want[b] = dense(query.view(bs, n, heads, dim)[b], keys, values, mask, dim ** -0.5)
        offset += n * (s + n)
    return got, want


@settings(max_examples=40, deadline=None)
@given(prefixes=st.lists(st.integers(0, 12), min_size=1, max_size=5), n=st.integers(1, 9),
       kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**16))
def test_batched_verify_is_each_requests_softmax_over_its_allowed_columns(prefixes, n, kv_heads, group, seed):
    """Ragged prefixes in one padded SDPA call: padding columns never leak into a request,
    a row that sees no key gets zeros, and the new keys land in the KV pool."""
    got, want = verify_forward(prefixes, n, kv_heads, group, seed)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("seed", range(4))
def test_torch_req_to_token_assign_equals_sglangs_triton_kernel(seed):
    """The plain-CPU replacement of a speculative step's ``req_to_token`` write
    (`cpu_compat._assign_req_to_token_torch`) against SGLang's Triton kernel in the interpreter,
    on random batches: rows out of order, zero-length requests, lengths past the kernel's 32-wide block."""
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool, next_power_of_2

    from sglang_reanchor.srt.cpu_compat import _assign_req_to_token_torch

    g = torch.Generator().manual_seed(seed)
    bs, rows, width = int(torch.randint(1, 9, (1,), generator=g)), 12, 96
    slots = torch.randperm(rows, generator=g)[:bs]
    start = torch.randint(0, 40, (bs,), generator=g)
    lengths = torch.randint(0, 50, (bs,), generator=g) * (torch.rand(bs, generator=g) > 0.2)
    end = start + lengths
    loc = torch.randint(1, 10_000, (int(lengths.sum()),), generator=g)
    want = torch.randint(0, 10_000, (rows, width), generator=g, dtype=torch.int32)
    before, got = want.clone(), want.clone()
    assign_req_to_token_pool[(bs,)](slots, want, start, end, loc, width, next_power_of_2(bs))
    _assign_req_to_token_torch(None, slots, got, start, end, loc, bs)
    assert torch.equal(got, want)
    assert int((got != before).sum()) > 0 or int(lengths.sum()) == 0  # the case wrote something


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=6), kv_heads=st.sampled_from([1, 3]),
       group=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
@example(lens=[9, 9, 9], kv_heads=3, group=3, seed=1)  # one length: the step runs without a mask
@example(lens=[9, 2, 9], kv_heads=3, group=3, seed=1)
def test_batched_decode_equals_torch_natives_loop(lens, kv_heads, group, seed):
    """A plain decode step in one padded SDPA call equals SGLang's ``torch_native`` loop (one SDPA
    call per request) on SGLang's own pools: ragged and equal lengths, scattered slots, GQA, the new
    KV cached."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_reanchor.srt.cpu_attention import ReAnchorSdpaBackend

    gen = torch.Generator().manual_seed(seed)
    bs, heads, dim = len(lens), kv_heads * group, 8
    pool_size = 3 * sum(lens) + 8
    req_pool = ReqToTokenPool(size=bs + 2, max_context_len=max(lens) + 2, device="cpu", enable_memory_saver=False)
    pools = [MHATokenToKVPool(size=pool_size, page_size=1, dtype=torch.float32, head_num=kv_heads, head_dim=dim,
                              layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
             for _ in range(2)]
    k0, v0 = torch.randn(pools[0].get_key_buffer(0).shape, generator=gen), torch.randn(pools[0].get_value_buffer(0).shape, generator=gen)
    for pool in pools:
        pool.get_key_buffer(0).copy_(k0)
        pool.get_value_buffer(0).copy_(v0)
    slots = torch.randperm(pool_size - 1, generator=gen)[: sum(lens)] + 1
    rows = torch.randperm(bs + 1, generator=gen)[:bs] + 1
    used, new_loc = 0, []
    for b, s in enumerate(lens):
        req_pool.req_to_token[rows[b], :s] = slots[used: used + s].int()
        new_loc.append(slots[used + s - 1])
        used += s
    query = torch.randn(bs, heads * dim, generator=gen)
    key, value = torch.randn(bs, kv_heads, dim, generator=gen), torch.randn(bs, kv_heads, dim, generator=gen)
    seq_lens = torch.tensor(lens)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
                            req_pool_indices=rows, out_cache_loc=torch.stack(new_loc), encoder_lens=None)
    layer = RadixAttention(heads, dim, dim ** -0.5, kv_heads, layer_id=0)
    outs = []
    for pool, forward in zip(pools, (ReAnchorSdpaBackend.forward_decode, TorchNativeAttnBackend.forward_decode)):
        runner = SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=pool, page_size=1)
        outs.append(forward(ReAnchorSdpaBackend(runner), query, key, value, layer, batch))
    got, want = outs
    assert torch.equal(pools[0].get_key_buffer(0)[batch.out_cache_loc], key)  # the new keys are cached
    assert torch.equal(pools[0].get_key_buffer(0), pools[1].get_key_buffer(0))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_attention_benchmark_checks_both_backends_and_writes_its_table(tmp_path):
    """`scripts/cpu_attention_bench.py` on ragged and equal batches: it asserts the backend equals
    ``torch_native`` and the gather equals advanced indexing before timing, then writes its JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for ragged in ([], ["--ragged"]):
        out = tmp_path / ("ragged" if ragged else "equal")
        run = subprocess.run([sys.executable, str(root / "scripts" / "cpu_attention_bench.py"), "--batch-sizes", "1",
                              "3", "--context", "24", "--iters", "2", "--repeats", "1", "--out", str(out), *ragged],
                             capture_output=True, text=True, timeout=300, cwd=root)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "| requests | torch_native | reanchor_sdpa |" in run.stdout
        rows = json.loads((out / "attention.json").read_text())["results"]
        assert [r["batch_size"] for r in rows] == [1, 3]
        assert (len(set(rows[1]["lens"])) > 1) == bool(ragged)
        assert all(r[k] > 0 for r in rows for k in r if k.endswith("_us"))
