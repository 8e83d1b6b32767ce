"""`greedy_with_features`: the training-data generator equals HF greedy and HF features."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_reanchor.train.batch_greedy import greedy_with_features
from sglang_reanchor.train.data import generate_responses, target_features

from factories import EOS_ID, PAD_ID, tiny_target


@pytest.mark.parametrize("family,seed,layer_ids", [("llama", 0, (0, 2)), ("qwen3", 1, (1, 3)),
                                                   ("llama", 2, (3,)), ("qwen3", 3, (2, 0, 3))])
def test_responses_and_features_equal_hf_generate_and_a_second_forward(family, seed, layer_ids) -> None:
    # vocab 8 with EOS among it: rows end at different steps, so dead rows are dropped mid-batch
    model = tiny_target(family, vocab_size=8, seed=seed, num_heads=4, num_kv_heads=2)
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 8) for _ in range(rng.randint(1, 9))] for _ in range(11)]
    eos = {EOS_ID, 3 + seed % 5}  # a second, common stop token: rows end at many different steps
    got = greedy_with_features(model, prompts, max_new_tokens=12, eos_ids=eos, layer_ids=layer_ids, pad_id=PAD_ID)
    want = generate_responses(model, prompts, max_new_tokens=12, eos_ids=eos, pad_id=PAD_ID)
    assert [r for r, _ in got] == want
    assert len({len(r) for r in want}) > 1  # the case really has rows of different lengths
    feats = target_features(model, [p + r for p, r in zip(prompts, want)], layer_ids, PAD_ID)
    for (_, f), ref, p, r in zip(got, feats, prompts, want):
        assert f.shape == (len(p) + len(r), len(layer_ids) * model.config.hidden_size)
        torch.testing.assert_close(f.float(), ref.float(), rtol=1e-2, atol=1e-2)  # both stored in bfloat16


def test_features_of_the_last_layer_are_after_the_final_norm() -> None:
    model = tiny_target("llama", vocab_size=16, seed=5)
    prompts = [[3, 4, 5], [6]]
    got = greedy_with_features(model, prompts, max_new_tokens=3, eos_ids={EOS_ID}, layer_ids=(3,), pad_id=PAD_ID)
    seqs = [p + r for p, (r, _) in zip(prompts, got)]
    for (_, f), ref in zip(got, target_features(model, seqs, (3,), PAD_ID)):
        torch.testing.assert_close(f.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_bad_arguments_are_refused_with_the_field_named() -> None:
    model = tiny_target("llama")
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_with_features(model, [[3]], max_new_tokens=0, eos_ids={EOS_ID}, layer_ids=(0,))
    with pytest.raises(ValueError, match="at least one token"):
        greedy_with_features(model, [[3], []], max_new_tokens=2, eos_ids={EOS_ID}, layer_ids=(0,))
    with pytest.raises(ValueError, match="layer_ids"):
        greedy_with_features(model, [[3]], max_new_tokens=2, eos_ids={EOS_ID}, layer_ids=(4,))
