"""GPU check of tree-verify attention: Triton and FlashInfer vs the torch reference.

One command, sized for < 5 minutes on one H200 (the default grid is 27 configurations;
``--time-budget`` stops early and marks the rest as skipped)::

    python scripts/gpu_check_attention.py
    python scripts/gpu_check_attention.py --batch-sizes 1,64 --prefix-lens 32768 --tree-sizes 128

For each (batch, prefix, tree size) it builds random trees over scattered KV slots
(page size 1, as SGLang keeps its cache), checks both kernels against the torch backend
(``attention.reference``, float32 math) and prints median kernel times. Timed regions are
device work only, as in a model forward: one ``plan_tree_attention`` per case, then the
backends' ``run(layout, q, k, v)``; FlashInfer after its own ``plan()``. Exit status is 1 if
any kernel disagrees with the reference.

``--device cpu`` is a smoke mode for machines without a GPU: Triton runs under its
interpreter (slow: use tiny sizes), FlashInfer is skipped, times are wall-clock.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from attention import (
    FlashInferTreeAttention,
    TorchTreeAttention,
    TreeAttentionBackend,
    TreeAttentionLayout,
    TreeAttentionSpec,
    TreeBatch,
    TreePlan,
    get_backend,
    plan_tree_attention,
    plan_tree_batch,
)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8, 64], help="comma list (default 1,8,64)")
    parser.add_argument(
        "--prefix-lens", type=int_list, default=[1024, 8192, 32768], help="comma list (default 1024,8192,32768)"
    )
    parser.add_argument("--tree-sizes", type=int_list, default=[16, 64, 128], help="comma list (default 16,64,128)")
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--atol", type=float, default=2e-2)
    parser.add_argument("--rtol", type=float, default=2e-2)
    parser.add_argument("--time-budget", type=float, default=240.0, help="seconds before skipping the rest")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: interpreter smoke mode")
    args = parser.parse_args(argv)
    if args.num_kv_heads < 1 or args.num_q_heads % args.num_kv_heads:
        parser.error("--num-q-heads must be a multiple of --num-kv-heads")
    if min(args.batch_sizes + args.tree_sizes) < 1 or min(args.prefix_lens) < 0:
        parser.error("batch sizes and tree sizes must be >= 1, prefix lengths >= 0")
    return args


def median_ms(fn: Callable[[], object], warmup: int, iters: int, device: str) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, iters)):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def random_parents(n: int, gen: torch.Generator) -> torch.Tensor:
    """Half the nodes extend the previous node (deep paths), half branch from a random earlier node."""
    idx = torch.arange(n)
    rand = (torch.rand(n, generator=gen) * idx).long()
    chain = torch.rand(n, generator=gen) < 0.5
    parents = torch.where(chain, idx - 1, rand)
    parents[0] = -1
    return parents


@dataclass(frozen=True)
class Case:
    batch: TreeBatch
    plan: TreePlan
    layout: TreeAttentionLayout  # planned once, run by every backend
    q: Tensor  # [bs * nodes, num_q_heads, head_dim]
    k: Tensor  # [num_slots, num_kv_heads, head_dim]
    v: Tensor  # [num_slots, num_kv_heads, head_dim]


def make_case(bs: int, prefix: int, nodes: int, args: argparse.Namespace, gen: torch.Generator) -> Case:
    dtype, dev = DTYPES[args.dtype], torch.device(args.device)
    prefix_lens = (prefix * (0.75 + 0.25 * torch.rand(bs, generator=gen))).long()  # requests differ
    prefix_lens[0] = prefix
    total = int(prefix_lens.sum()) + bs * nodes
    num_slots = total + 1024
    batch = TreeBatch(
        parents=tuple(random_parents(nodes, gen).to(dev) for _ in range(bs)),
        prefix_lens=prefix_lens.to(dev),
        kv_indices=torch.randperm(num_slots, generator=gen)[:total].to(dev),  # scattered slots
    )
    shape = (num_slots, args.num_kv_heads, args.head_dim)
    plan = plan_tree_batch(batch)
    return Case(
        batch=batch,
        plan=plan,
        layout=plan_tree_attention(
            TreeAttentionSpec.from_tree_plan(plan, args.num_q_heads, args.num_kv_heads, args.head_dim)),
        q=torch.randn(bs * nodes, args.num_q_heads, args.head_dim, device=dev, dtype=dtype),
        k=torch.randn(shape, device=dev, dtype=dtype),
        v=torch.randn(shape, device=dev, dtype=dtype),
    )


@functools.cache
def triton_backend(device: str) -> TreeAttentionBackend:
    """The Triton backend, made once (the first call imports triton)."""
    return get_backend("triton", device)


def check_one(
    case: Case, args: argparse.Namespace, flashinfer_runner: FlashInferTreeAttention | None
) -> dict[str, str]:
    layout, reference = case.layout, TorchTreeAttention()
    ref = reference.run(layout, case.q, case.k, case.v).float()
    row = {"ref_ms": f"{median_ms(lambda: reference.run(layout, case.q, case.k, case.v), 1, 3, args.device):.2f}"}

    def triton_fn() -> Tensor:
        return triton_backend(args.device).run(layout, case.q, case.k, case.v)

    backends: list[tuple[str, Callable[[], Tensor]]] = []
    if not args.no_triton:
        backends.append(("triton", triton_fn))
    if flashinfer_runner is not None:
        runner = flashinfer_runner
        backends.append(("fi", lambda: runner.run(case.q, case.k, case.v)))
    ok = True
    for name, fn in backends:
        try:
            if flashinfer_runner is not None and name == "fi":
                flashinfer_runner.plan(case.batch)
            out = fn().float()
            err = (out - ref).abs().max().item()
            good = torch.allclose(out, ref, atol=args.atol, rtol=args.rtol) and not bool(out.isnan().any())
            row[f"{name}_err"] = f"{err:.1e}" + ("" if good else " FAIL")
            row[f"{name}_ms"] = f"{median_ms(fn, args.warmup, args.iters, args.device):.3f}"
        except Exception as exc:  # one backend failing must not hide the other's numbers
            good = False
            row[f"{name}_err"] = f"ERROR {type(exc).__name__}"
            print(f"  {name} failed: {exc}", file=sys.stderr)
        ok &= good
    row["status"] = "ok" if ok else "MISMATCH"
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before attention.triton_tree imports triton
    elif not torch.cuda.is_available():
        print("gpu_check_attention: no CUDA device; nothing to check (--device cpu for a smoke run)", file=sys.stderr)
        return 2
    runner = None
    if not args.no_flashinfer and args.device == "cuda":
        try:
            workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
            runner = FlashInferTreeAttention(
                workspace, args.num_q_heads, args.num_kv_heads, args.head_dim, DTYPES[args.dtype]
            )
        except ImportError as exc:
            print(f"flashinfer unavailable ({exc}); FlashInfer columns skipped")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (triton interpreter)"
    print(
        f"device: {name}  dtype {args.dtype}  heads {args.num_q_heads}/{args.num_kv_heads}"
        f"  head_dim {args.head_dim}  times: median of {args.iters} (ms)"
    )
    cols = ["bs", "prefix", "nodes", "ref_ms", "triton_ms", "triton_err", "fi_ms", "fi_err", "status"]
    print(" | ".join(f"{c:>11}" for c in cols))
    gen = torch.Generator().manual_seed(args.seed)
    start, failures = time.monotonic(), 0
    for bs in args.batch_sizes:
        for prefix in args.prefix_lens:
            for nodes in args.tree_sizes:
                row = {"bs": str(bs), "prefix": str(prefix), "nodes": str(nodes)}
                if time.monotonic() - start > args.time_budget:
                    row["status"] = "skipped"
                else:
                    try:
                        row |= check_one(make_case(bs, prefix, nodes, args, gen), args, runner)
                    except Exception as exc:  # report and keep going: one table for the whole grid
                        row["status"] = f"ERROR {type(exc).__name__}: {exc}"[:120]
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                failures += row["status"] not in ("ok", "skipped")
                print(" | ".join(f"{row.get(c, '-'):>11}" for c in cols), flush=True)
    print(f"done in {time.monotonic() - start:.0f} s, {failures} failing configuration(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
