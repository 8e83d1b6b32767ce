"""The automatic precision choice: bfloat16 only where bfloat16 GEMMs are native."""

from __future__ import annotations

import pytest
import torch

from sglang_reanchor import precision


def test_flags_read_from_cpuinfo_are_the_bf16_ones() -> None:
    flags = precision.cpu_bf16_flags()
    assert set(flags) <= {"amx_bf16", "avx512_bf16"}
    assert precision.has_fast_cpu_bf16() == bool(flags)
    assert precision.auto_dtype("cpu") == (torch.bfloat16 if flags else torch.float32)


@pytest.mark.parametrize("flags, want", [((), torch.float32), (("amx_bf16",), torch.bfloat16),
                                         (("avx512_bf16",), torch.bfloat16)])
def test_auto_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...],
                                    want: torch.dtype) -> None:
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: flags)
    assert precision.auto_dtype("cpu") is want
    assert precision.parse_dtype("auto", "cpu") is want and precision.parse_dtype(None) is want
    assert precision.auto_dtype("cuda") is torch.bfloat16  # whatever the CPU


def test_explicit_dtypes_and_bad_names() -> None:
    assert precision.parse_dtype("bfloat16") is torch.bfloat16
    assert precision.parse_dtype(torch.float64) is torch.float64
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        precision.parse_dtype("fp8")
