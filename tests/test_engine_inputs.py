"""Bad input to the engine gets a clear error naming the field; state is always released."""

from __future__ import annotations

import pytest
import torch
from factories import tiny_drafter, tiny_target

from sglang_reanchor import DFlashDrafter, ReAnchorConfig, SpeculativeGenerator


@pytest.fixture(scope="module")
def gen():
    target = tiny_target("qwen3", vocab_size=16, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1)
    return SpeculativeGenerator(target, tiny_drafter(target, block_size=4), ReAnchorConfig())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(input_ids=[]), "input_ids is empty"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), r"\[1, P\]"),
        (dict(input_ids=[1, 99]), r"input_ids must lie in \[0, 15\]"),
        (dict(input_ids=[-1]), "input_ids must lie in"),
        (dict(input_ids=torch.tensor([[0.5]])), "integer token ids"),
        (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
        (dict(max_new_tokens=600), "exceeds the target's max_position_embeddings"),
        (dict(method="eagle"), "method must be one of 'target', 'dflash', 'reanchor'"),
        (dict(temperature=-0.5), "temperature must be"),
        (dict(temperature=1.0, top_k=0), "top_k must be"),
        (dict(temperature=1.0, top_p=2.0), "top_p must be"),
    ],
)
def test_bad_generate_arguments(gen, kwargs, message):
    args = dict(input_ids=[1, 2, 3], max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=message):
        gen.generate(**args)


def test_accepts_list_1d_and_2d_tensors(gen):
    a = gen.generate([1, 2, 3], 5).tokens
    assert gen.generate(torch.tensor([1, 2, 3]), 5).tokens == a
    assert gen.generate(torch.tensor([[1, 2, 3]]), 5).tokens == a
    assert len(a) == 5


def test_interrupted_request_releases_its_state(gen, monkeypatch):
    """An exception mid-generation (e.g. an abort) leaves no rejected suffix behind."""
    calls = {"n": 0}
    original = gen._commit

    def commit_then_abort(*args, **kwargs):
        original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(gen, "_commit", commit_then_abort)
    with pytest.raises(KeyboardInterrupt):
        gen.generate([1, 2, 3], 40)
    assert calls["n"] == 3 and len(gen.suffixes) == 0


def test_drafter_for_another_target_is_refused():
    target = tiny_target("llama", vocab_size=16, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1)
    other = tiny_target("llama", vocab_size=16, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="hidden_size"):
        SpeculativeGenerator(target, tiny_drafter(other, block_size=4), ReAnchorConfig())
    deep = tiny_target("llama", vocab_size=16, hidden_size=16, num_layers=6, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="target_layer_ids"):
        SpeculativeGenerator(target, tiny_drafter(deep, block_size=4, target_layer_ids=[5]), ReAnchorConfig())
    big_vocab = tiny_target("llama", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="mask_token_id"):
        SpeculativeGenerator(target, tiny_drafter(big_vocab, block_size=4), ReAnchorConfig())
    assert isinstance(tiny_drafter(target), DFlashDrafter)
