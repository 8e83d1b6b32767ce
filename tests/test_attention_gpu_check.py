"""scripts/gpu_check_attention.py parses its arguments and runs its CPU smoke mode."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check_attention.py"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_help_and_argument_errors() -> None:
    result = run_script("--help")
    assert result.returncode == 0 and "--batch-sizes" in result.stdout and "--time-budget" in result.stdout
    bad = run_script("--num-q-heads", "5", "--num-kv-heads", "2")
    assert bad.returncode == 2 and "multiple" in bad.stderr


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cpu_smoke_run_prints_a_passing_table() -> None:
    result = run_script(
        *("--device", "cpu", "--batch-sizes", "1,2", "--prefix-lens", "0,7", "--tree-sizes", "3"),
        *("--num-q-heads", "4", "--num-kv-heads", "2", "--head-dim", "16", "--warmup", "0", "--iters", "1"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip().endswith("ok")]
    assert len(rows) == 4
