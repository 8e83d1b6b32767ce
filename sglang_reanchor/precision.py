"""Which floating-point type to run the models in: bfloat16 where the hardware has fast
bfloat16 matrix units, float32 elsewhere.

On CUDA, bfloat16. On a CPU it depends on the chip, and the difference is large in
both directions (measured with torch 2.13, one process, 2 threads):

- Intel Sapphire Rapids and later (``amx_bf16``): oneDNN runs bfloat16 GEMMs on AMX
  tiles; a SmolLM2 forward over 32 tree nodes costs 1.2x one token in bfloat16
  against 2.5x in float32, so verification is nearly free, as on a GPU.
- CPUs with AVX-512 BF16 only (``avx512_bf16``) also run bfloat16 GEMMs natively. On
  the AMD EPYC Zen 4 machines of 2026-12-01 (2 cores): 1024 x 576 x 1536 at 434 GFLOP/s
  in bfloat16 against 199 in float32; 16 x 576 x 1536 at 206 against 108; the
  49,152 x 576 LM head on one row (memory-bound) 3.0 ms against 9.9 ms.
- CPUs with neither (AMD EPYC Milan, AVX2): bfloat16 GEMMs are emulated and ~9x
  *slower* than float32 (1024 x 576 x 1536: 6.6 against 58 GFLOP/s on one core).

`auto_dtype` picks accordingly; every entry point takes ``dtype=`` to override it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

__all__ = ["auto_dtype", "cpu_bf16_flags", "has_fast_cpu_bf16", "parse_dtype"]

_FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's bfloat16 matrix flags from ``/proc/cpuinfo`` (empty where there is none
    or the file is missing, e.g. on macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(f for f in _FAST_BF16_FLAGS if f in flags)


def has_fast_cpu_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AMX or AVX-512 BF16)."""
    return bool(cpu_bf16_flags())


def auto_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """bfloat16 on CUDA and on CPUs with fast bfloat16 (`has_fast_cpu_bf16`), else float32."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda" or (kind == "cpu" and has_fast_cpu_bf16()):
        return torch.bfloat16
    return torch.float32


def parse_dtype(name: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype:
    """``"auto"`` / None -> `auto_dtype`; ``"float32"``, ``"bfloat16"``, ``"float16"``,
    ``"float64"`` (or a ``torch.dtype``) as given.

    >>> parse_dtype("float32")
    torch.float32
    """
    if isinstance(name, torch.dtype):
        return name
    if name is None or name == "auto":
        return auto_dtype(device)
    allowed = ("auto", "float32", "bfloat16", "float16", "float64")
    if name not in allowed:
        raise ValueError(f"dtype must be one of {', '.join(allowed)}; got {name!r}")
    return getattr(torch, name)
