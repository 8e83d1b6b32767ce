"""The invariant on the real CPU model: SmolLM2-135M-Instruct, chat prompts, HF greedy as the oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is 17 times 23? Answer briefly.",
    "Write a Python function that reverses a string.",
    "Name three colours of the rainbow.",
]


@pytest.fixture(scope="module")
def gen():
    return SpeculativeGenerator.from_pretrained(config=ReAnchorConfig(offsets=(1, 2, 3), node_budget=40))


def test_default_pair_loads_with_tokenizer(gen):
    assert gen.target.config.model_type == "llama" and gen.target.config.num_hidden_layers == 30
    assert gen.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")
    assert gen.drafter.provenance


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_equals_hf_greedy_on_smollm2(gen, prompt):
    ids = gen.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    expected = gen.target.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False
    )[0, ids.shape[1]:].tolist()
    for method in ("target", "dflash", "reanchor"):
        assert gen.generate(ids, 40, method=method).tokens == expected, method
