"""Index tensors a round reuses: each built once per size and device, then shared.

Every round asks for the same few index tensors (node ids, depths, grid rows, the
diagonal of a node mask): building them once takes their kernels out of the round
(`sglang_reanchor.bench.round_ops` counts what is left), and a CUDA graph records
them as constant inputs. The first call of each shape must come before a graph
capture (SGLang warms up eagerly first), so that the tensor lives outside the graph's
memory pool.

They are shared: nothing may write into one (every caller only reads them).

>>> arange(4, torch.device("cpu")).tolist(), arange(4, torch.device("cpu")) is arange(4, torch.device("cpu"))
([0, 1, 2, 3], True)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["arange", "diagonal", "lower_triangle", "shared_per_size"]


def arange(n: int, device: torch.device | str) -> Tensor:
    """``[n]`` long: ``0 .. n-1``."""
    return _arange(n, str(device))


def diagonal(n: int, device: torch.device | str) -> Tensor:
    """``[n]`` long: the flat indices ``i * (n + 2)`` of the diagonal of an ``(n + 1) x (n + 1)`` matrix."""
    return _diagonal(n, str(device))


def lower_triangle(n: int, device: torch.device | str) -> Tensor:
    """``[n, n]`` bool: ``[t, t']`` iff ``t' <= t``."""
    return _lower_triangle(n, str(device))


def shared_per_size(build: Callable[[int, str], Tensor]) -> Callable[[int, str], Tensor]:
    """``build(n, device)`` made a cache: one tensor per ``(n, device)``, an ordinary tensor whatever
    mode (inference, no-grad) the first caller ran in. Under ``torch.compile`` it is ``build``
    itself: the compiled graph holds the tensor as a constant."""
    @functools.lru_cache(maxsize=256)
    def cache(n: int, device: str) -> Tensor:
        with torch.inference_mode(False), torch.no_grad():
            return build(n, device)

    @functools.wraps(build)
    def cached(n: int, device: str) -> Tensor:
        return build(n, device) if torch.compiler.is_compiling() else cache(n, device)

    return cached


@shared_per_size
def _arange(n: int, device: str) -> Tensor:
    return torch.arange(n, device=device)


@shared_per_size
def _diagonal(n: int, device: str) -> Tensor:
    return torch.arange(n, device=device) * (n + 2)


@shared_per_size
def _lower_triangle(n: int, device: str) -> Tensor:
    t = torch.arange(n, device=device)
    return t[None, :] <= t[:, None]
