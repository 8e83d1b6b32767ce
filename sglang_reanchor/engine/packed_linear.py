"""Linear layers whose float32 weights are packed once for oneDNN (CPU).

torch's float32 ``F.linear`` on a CPU runs a matrix-vector kernel for one token and a
general GEMM for two or more, and the GEMM repacks the weight on every call: on a 2-core
AVX2 Zen 3 a 2-token forward of SmolLM2-135M costs 1.77x a 1-token one, so every verify
of a few tree nodes costs nearly two decode steps. Packing each weight once into oneDNN's
blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing does)
and calling ``torch.ops.mkldnn._linear_pointwise`` gives the same logits (max |difference|
7e-5 there) and runs the forward 1.14x faster for 1 token, 1.80x for 2, 1.29x for 8 and
1.25x for 16 (``results/2026-12-06_zen3-v7-3ec5d29a511d/packed_linear_estimate.*``).

Inputs of more than ``max_rows`` rows (128) go through ``F.linear``, which is about as fast for a
long prompt's prefill. The limit was 16 rows at first (from one whole-model forward of 32 tokens at
prefix 0: 158 ms packed against 147); that sent the drafter's second block (32 rows) to ``F.linear``:
two ReAnchor blocks cost 50-54 ms against 28-35 ms with a 128-row limit, verifies of 24-48 nodes
148-260 ms against 131-214 (prefix 256, ``results/2026-12-06_zen3-v7-3ec5d29a511d/packed_max_rows.*``).

`pack_linears` swaps a model's float32 CPU ``nn.Linear`` modules for `PackedLinear` in
place. `packing_speedup` measures, on this machine, how much faster the packed kernels run
the model's own linear shapes at 1, 2 and 8 rows; ``SpeculativeGenerator.from_pretrained``
packs a float32 CPU pair where that is at least `PAYS` (plain decoding runs the packed target
too, so comparisons stay fair). The original weight stays the module's ``weight`` (tied
embeddings, draft vocabularies and checkpoints read it); the packed copy is extra memory of
the same size. Inference only (no gradient).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PAYS", "PackedLinear", "pack_linears", "packing_available", "packing_speedup"]

PAYS = 1.05  # pack where the packed kernels run the model's linears at least this much faster
MAX_ROWS = 128  # above this many rows (a long prefill) F.linear: see the module docstring


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear ops (CPU builds do)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


class PackedLinear(nn.Module):
    """``linear`` (float32, CPU) with its weight packed once; ``x [..., in] -> [..., out]``."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 8, max_rows: int = MAX_ROWS) -> None:
        super().__init__()
        if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
            raise ValueError(f"PackedLinear takes a float32 CPU nn.Linear, got {linear.weight.dtype} on "
                             f"{linear.weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the original, shared (tied embeddings, draft vocabularies read it)
        self.bias = linear.bias
        if max_rows < 1:
            raise ValueError(f"PackedLinear max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.to(torch.float32).contiguous()
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _packable(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear and child.weight.dtype == torch.float32
            and child.weight.device.type == "cpu"]


def pack_linears(model: nn.Module, batch_hint: int = 8) -> int:
    """Replace every float32 CPU ``nn.Linear`` in ``model`` by a `PackedLinear`, in place;
    returns how many. Nothing changes where oneDNN's ops are missing (returns 0)."""
    if not packing_available():
        return 0
    swaps = _packable(model)
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child, batch_hint))
    return len(swaps)


def packing_speedup(*models: nn.Module, rows: tuple[int, ...] = (1, 2, 8), repeats: int = 5) -> float | None:
    """How much faster packed kernels run the models' float32 CPU linears than ``F.linear``, here.

    Each distinct weight shape is timed once per row count (best of ``repeats``) both ways and
    weighted by how many layers have it: the ratio of the models' total linear time at decode
    sizes. None where there is nothing to pack (no oneDNN ops, no float32 CPU linear). About
    0.2 s for SmolLM2-135M and its drafter on a 2-core CPU.
    """
    if not packing_available():
        return None
    shapes = Counter(tuple(child.weight.shape) for model in models for _, _, child in _packable(model))
    if not shapes:
        return None
    plain = packed = 0.0
    with torch.inference_mode():
        for (out_features, in_features), count in shapes.items():
            weight = torch.randn(out_features, in_features) * in_features ** -0.5
            blocked = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
            for n in rows:
                x = torch.randn(n, in_features)
                plain += count * _best_time(lambda: F.linear(x, weight), repeats)
                packed += count * _best_time(
                    lambda: torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], ""), repeats)
    return plain / packed


def _best_time(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best
