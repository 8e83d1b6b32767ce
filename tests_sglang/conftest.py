"""Fixtures for the SGLang tests (run with the SGLang venv: scripts/install_sglang.sh).

Every test here needs SGLang; the module is skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Triton kernels run in the interpreter on CPU; it must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("sglang")

# A tiny Llama target and a DFlash drafter for it: configs only, for argument resolution.
TINY_TARGET = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}
TINY_DRAFTER = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": 8, "num_target_layers": 4,
    "layer_types": ["full_attention"], "tie_word_embeddings": True,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 2]}, "torch_dtype": "float32",
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(target_dir, drafter_dir)`` holding config.json only."""
    root = tmp_path_factory.mktemp("tiny")
    target, drafter = root / "target", root / "drafter"
    for folder, cfg in ((target, TINY_TARGET), (drafter, TINY_DRAFTER)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    return target, drafter


def run_fresh(code: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter of this venv (nothing imported beforehand)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full_env, timeout=timeout)
