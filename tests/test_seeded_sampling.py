"""Per-row filtering (SGLang's semantics), min-p, and the position-keyed seeded draw.

The strongest check is the last one: with a seed, `SpeculativeGenerator` emits at
T > 0 exactly the tokens of seeded plain decoding, for DFlash and ReAnchor, on
random tiny pairs and configurations (the draw depends on seed and position only,
and tree siblings share it).
"""

from __future__ import annotations

import random

import pytest
import torch
from factories import tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.sampling import SamplingParams, TokenDraw, filtered_probs, seeded_draw, target_probs


def sglang_reference(logits, temperature, top_k, top_p, min_p):
    """SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch`` filtering, restated row by row."""
    rows = []
    for b in range(logits.shape[0]):
        probs = (logits[b].double() / temperature[b]).softmax(-1)
        sorted_p, order = probs.sort(descending=True)
        keep = torch.ones_like(sorted_p, dtype=torch.bool)
        keep[int(top_k[b]):] = False
        keep &= ~((sorted_p.cumsum(0) - sorted_p) > top_p[b])
        keep &= ~(sorted_p < min_p[b] * sorted_p[0])
        keep[0] = True
        out = torch.zeros_like(probs)
        out[order[keep]] = probs[order[keep]]
        rows.append(out / out.sum())
    return torch.stack(rows)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(2, 40), st.integers(0, 2**31), st.data())
def test_filtered_probs_matches_sglangs_semantics_per_row(rows, vocab, seed, data):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2
    temperature = torch.tensor([data.draw(st.sampled_from([0.3, 0.7, 1.0, 1.6])) for _ in range(rows)])
    top_k = torch.tensor([data.draw(st.integers(1, vocab + 3)) for _ in range(rows)])
    top_p = torch.tensor([data.draw(st.sampled_from([1.0, 0.95, 0.6, 0.2])) for _ in range(rows)])
    min_p = torch.tensor([data.draw(st.sampled_from([0.0, 0.05, 0.3])) for _ in range(rows)])
    got = filtered_probs(logits, temperature, top_k, top_p, min_p)
    torch.testing.assert_close(got.double(), sglang_reference(logits, temperature, top_k, top_p, min_p),
                               rtol=1e-5, atol=1e-6)


def test_filtered_probs_agrees_with_target_probs_for_one_filter():
    logits = torch.randn(6, 30, generator=torch.Generator().manual_seed(3))
    ones, zeros = torch.ones(6), torch.zeros(6)
    full = torch.full((6,), 30)
    for kwargs, args in (({"top_k": 5}, (ones * 0.8, torch.full((6,), 5), ones, zeros)),
                         ({"min_p": 0.2}, (ones * 0.8, full, ones, zeros + 0.2)),
                         ({}, (ones * 0.8, full, ones, zeros))):
        want = target_probs(logits, SamplingParams(temperature=0.8, **kwargs))
        torch.testing.assert_close(filtered_probs(logits, *args), want, rtol=1e-5, atol=1e-6)


def test_min_p_is_validated_and_applied():
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(temperature=1.0, min_p=1.5)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = target_probs(logits, SamplingParams(temperature=1.0, min_p=0.4))  # cut at 0.2
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.0, 0.0]]) / 0.8)


def test_seeded_draw_samples_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 40_000
    draws = seeded_draw(probs.expand(n, -1), torch.arange(n), torch.full((n,), 7))
    freq = torch.bincount(draws, minlength=5).double() / n
    assert freq[4] == 0  # a zero-probability token is never drawn
    assert (freq - probs.double()).abs().max() < 0.01  # ~4.5 sigma at n = 40k
    again = seeded_draw(probs.expand(n, -1), torch.arange(n), torch.full((n,), 7))
    assert torch.equal(draws, again)  # a pure function of (seed, position, probs)
    other = seeded_draw(probs.expand(n, -1), torch.arange(n), torch.full((n,), 8))
    assert 0.33 < (other == draws).double().mean() < 0.36  # another position: fresh noise (P(equal) = 0.345)


def test_token_draw_with_a_seed_ignores_the_batch_around_it():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
    draw = TokenDraw(SamplingParams(temperature=1.0), seed=123)
    alone = draw(logits[2:3], torch.tensor([9]))
    assert draw(logits, torch.tensor([5, 6, 9, 9]))[2] == alone[0]


def make_pair(case: int):
    rng = random.Random(case)
    vocab = rng.choice([4, 6, 8])
    block = rng.randint(4, 10)
    target = tiny_target(("llama", "qwen3")[case % 2], vocab_size=vocab, hidden_size=16, num_layers=2,
                         num_heads=2, num_kv_heads=1, seed=case)
    target.generation_config.eos_token_id = None
    target.config.eos_token_id = None
    drafter = tiny_drafter(target, block_size=block, num_layers=1, seed=500 + case, target_layer_ids=[0, 1])
    config = ReAnchorConfig(
        offsets=tuple(sorted(rng.sample(range(1, block), rng.randint(1, min(3, block - 1))))),
        policy=rng.choice(["earliest", "offset", "random", "longest_prefix"]),
        node_budget=rng.choice([block, 2 * block, 64]), seed=case,
    )
    prompt = torch.randint(0, vocab, (1, rng.randint(1, 8)), generator=torch.Generator().manual_seed(case))
    sampling = dict(temperature=rng.choice([0.6, 1.0, 1.5]), top_k=rng.choice([None, 3]),
                    top_p=rng.choice([None, 0.9]))
    return SpeculativeGenerator(target, drafter, config=config), prompt, sampling


@pytest.mark.parametrize("case", range(16))
def test_a_seed_gives_plain_decodings_tokens_at_t_above_zero(case):
    gen, prompt, sampling = make_pair(case)
    for seed in (case, 1000 + case):
        plain = gen.generate(prompt, 40, method="target", seed=seed, **sampling)
        for method in ("dflash", "reanchor"):
            out = gen.generate(prompt, 40, method=method, seed=seed, **sampling)
            assert out.tokens == plain.tokens, (method, seed)
    assert gen.generate(prompt, 40, method="target", seed=case, **sampling).tokens != \
        gen.generate(prompt, 40, method="target", seed=case + 1, **sampling).tokens  # the seed matters


def test_seeded_draw_never_draws_a_zero_probability_token():
    # zeros first, inside and last: the inverse CDF must step over each of them whatever the uniform
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    n = 20_000
    draws = seeded_draw(probs.repeat(n, 1), torch.arange(2 * n), torch.full((2 * n,), 3)).view(n, 2)
    assert set(draws[:, 0].tolist()) == {1, 4} and set(draws[:, 1].tolist()) == {5}
    assert abs((draws[:, 0] == 4).double().mean().item() - 0.7) < 0.015  # ~4.6 sigma at n = 20k


def test_seeded_draw_equals_the_gumbel_max_it_computes_faster():
    # the int32 hash equals the int64 one bit for bit, and argmax(p / E) equals argmax(log p - log E)
    from sglang_reanchor.sampling import _as_int32, _mix32, _mix32_int32

    x = torch.randint(0, 2**32, (4096,), generator=torch.Generator().manual_seed(1), dtype=torch.long)
    assert torch.equal(_mix32_int32(_as_int32(x)).long() & 0xFFFFFFFF, _mix32(x))
    gen = torch.Generator().manual_seed(2)
    probs = (torch.randn(64, 3000, generator=gen) * 3).softmax(-1)
    probs[:, ::7] = 0.0
    seeds, positions = torch.randint(0, 2**40, (64,), generator=gen), torch.randint(0, 4096, (64,), generator=gen)
    key = _mix32(_mix32(seeds ^ (seeds >> 32)) ^ _mix32(positions * 2 + 1))
    bits = _mix32(key[:, None] ^ _mix32(torch.arange(3000) * 2 + 0x632BE5AB)[None])
    gumbel = -torch.log(-torch.log((bits.double() + 0.5) / 2.0**32))
    assert torch.equal(seeded_draw(probs, seeds, positions), (probs.double().log() + gumbel).argmax(-1))
