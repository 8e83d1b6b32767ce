"""The reference engine verifying trees through this package's tree-attention backends (torch and Triton).

The backend plans once per target forward (at layer 0) and every layer runs on that layout.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU

import pytest
import torch
from factories import tiny_drafter, tiny_target

from attention.transformers_backend import use_tree_attention
from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator


def greedy(target, prompt, n):
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False)
    return out[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize(
    ("backend", "dtype", "seed"),
    [("torch", torch.float32, 0), ("torch", torch.float32, 1), ("triton", torch.float32, 2)],
)
def test_engine_with_tree_attention_backend_is_lossless(backend, dtype, seed):
    if backend == "triton":
        pytest.importorskip("triton")
    target = tiny_target("qwen3", vocab_size=6, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=seed, dtype=dtype)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    prompt = torch.tensor([[1, 4, 0, 5, 3]])
    expected = greedy(target, prompt, 20)  # oracle: HF's own SDPA attention
    drafter = tiny_drafter(target, block_size=6, seed=seed)
    forward = use_tree_attention(target, backend)
    assert target.config._attn_implementation == f"reanchor_tree_{backend}"
    forwards = []
    target.model.register_forward_hook(lambda *_: forwards.append(1))
    gen = SpeculativeGenerator(target, drafter, ReAnchorConfig(offsets=(1, 2), node_budget=24))
    for method in ("target", "dflash", "reanchor"):
        assert gen.generate(prompt, 20, method=method).tokens == expected, method
    assert len(forwards) > 0 and forward.plans == len(forwards)  # one plan per forward, not per layer


def test_unknown_backend_is_refused():
    target = tiny_target("llama", vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="backend must be one of 'torch', 'triton'"):
        use_tree_attention(target, "flash")
