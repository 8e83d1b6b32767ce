"""Microbenchmark of the plugin's CPU attention backend (``--attention-backend reanchor_sdpa``).

One plain decode step's attention for one layer, on SGLang's own KV pools, at the shapes of the
default CPU target (SmolLM2-135M: 9 query heads, 3 KV heads of 64), for 1-16 requests:

- ``torch_native``: SGLang's backend (one SDPA call per request);
- ``reanchor_sdpa``: the plugin's (one padded SDPA call for the batch);
- ``gather``: the backend's cached-K/V gather alone, by ``index_select`` (what it runs) and by 2-D
  advanced indexing ``cache[slots]`` (what it ran before stop 45).

Times are medians of ``--repeats`` blocks of ``--iters`` calls, in microseconds per call for one
layer (a forward runs one per layer: 30 on SmolLM2). Prints a table, writes JSON. Run with the
SGLang venv: ``build/sglang-venv/bin/python scripts/cpu_attention_bench.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch


def _timed(fn: Callable[[], Any], iters: int, repeats: int) -> float:
    """Median over ``repeats`` blocks of the mean time of one call, in microseconds."""
    for _ in range(max(3, iters // 10)):
        fn()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        blocks.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(blocks)


def _decode_case(lens: list[int], heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int) -> dict:
    """SGLang pools holding ``lens[b]`` cached tokens per request at scattered slots, a decode batch."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    gen = torch.Generator().manual_seed(seed)
    bs = len(lens)
    pool_size = 4 * sum(lens) + 8
    req_pool = ReqToTokenPool(size=bs + 2, max_context_len=max(lens) + 2, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(size=pool_size, page_size=1, dtype=dtype, head_num=kv_heads, head_dim=dim,
                               layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    kv_pool.get_key_buffer(0).copy_(torch.randn(kv_pool.get_key_buffer(0).shape, generator=gen))
    kv_pool.get_value_buffer(0).copy_(torch.randn(kv_pool.get_value_buffer(0).shape, generator=gen))
    slots = torch.randperm(pool_size - 1, generator=gen)[: sum(lens)] + 1  # slot 0 is SGLang's padding slot
    rows = torch.arange(bs) + 1
    used, new_loc = 0, []
    for b, s in enumerate(lens):
        req_pool.req_to_token[rows[b], :s] = slots[used: used + s].int()
        new_loc.append(slots[used + s - 1])
        used += s
    seq_lens = torch.tensor(lens)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
                            req_pool_indices=rows, out_cache_loc=torch.stack(new_loc), encoder_lens=None)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, page_size=1)
    return dict(
        runner=runner, batch=batch, layer=RadixAttention(heads, dim, dim ** -0.5, kv_heads, layer_id=0),
        query=torch.randn(bs, heads * dim, generator=gen).to(dtype),
        key=torch.randn(bs, kv_heads, dim, generator=gen).to(dtype),
        value=torch.randn(bs, kv_heads, dim, generator=gen).to(dtype),
    )


def main() -> None:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_reanchor.srt.cpu_attention import ReAnchorSdpaBackend, _gather

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--context", type=int, default=300, help="cached tokens of the longest request (default 300)")
    p.add_argument("--ragged", action="store_true", help="requests of different lengths (context/2 .. context)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="folder for attention.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    results = []
    for bs in args.batch_sizes:
        lens = [args.context - (args.context // 2) * b // max(1, bs - 1) if args.ragged else args.context
                for b in range(bs)]
        case = _decode_case(lens, args.heads, args.kv_heads, args.head_dim, dtype, seed=bs)
        runner, batch, layer = case["runner"], case["batch"], case["layer"]
        native, ours = TorchNativeAttnBackend(runner), ReAnchorSdpaBackend(runner)
        step = (case["query"], case["key"], case["value"], layer, batch)
        torch.testing.assert_close(ours.forward_decode(*step), native.forward_decode(*step), rtol=1e-4, atol=1e-4)
        cache = runner.token_to_kv_pool.get_key_buffer(0)
        slots = ours._decode_plan_for(batch).cached  # [bs, S]
        assert torch.equal(_gather(cache, slots, dtype), cache[slots])
        row = {
            "batch_size": bs, "lens": lens,
            "torch_native_us": _timed(lambda: native.forward_decode(*step), args.iters, args.repeats),
            "reanchor_sdpa_us": _timed(lambda: ours.forward_decode(*step), args.iters, args.repeats),
            "gather_index_select_us": _timed(lambda: _gather(cache, slots, dtype), args.iters, args.repeats),
            "gather_advanced_index_us": _timed(lambda: cache[slots].to(dtype), args.iters, args.repeats),
        }
        results.append(row)

    print(f"# one decode step's attention, one layer ({args.dtype}, {args.heads} heads / {args.kv_heads} KV heads "
          f"of {args.head_dim}, {torch.get_num_threads()} threads; {'ragged' if args.ragged else 'equal'} "
          f"lengths, longest {args.context}); microseconds per call\n")
    print("| requests | torch_native | reanchor_sdpa | (x) | K gather: index_select | advanced indexing | (x) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['batch_size']} | {r['torch_native_us']:.0f} | {r['reanchor_sdpa_us']:.0f} | "
              f"{r['torch_native_us'] / r['reanchor_sdpa_us']:.2f}x | {r['gather_index_select_us']:.0f} | "
              f"{r['gather_advanced_index_us']:.0f} | "
              f"{r['gather_advanced_index_us'] / r['gather_index_select_us']:.2f}x |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads()}
        (args.out / "attention.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        print(f"\nwrote {args.out / 'attention.json'}")


if __name__ == "__main__":
    main()
