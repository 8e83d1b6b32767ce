"""At T>0 speculative decoding must sample from the target's own distribution.

The exact distribution of the first three tokens is computed by enumerating all
``V**3`` continuations of a tiny-vocabulary target; the empirical frequencies of
``generate`` (fixed seeds) must match it in every cell, within 4.5 binomial
standard deviations (a deterministic test: the seeds are fixed).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from factories import tiny_drafter, tiny_target

from sglang_reanchor import ReAnchorConfig, SamplingParams, SpeculativeGenerator
from sglang_reanchor.sampling import target_probs

VOCAB, STEPS = 4, 3


def exact_joint(target, prompt, params):
    """P(first STEPS tokens) under the target with ``params``, by enumeration."""
    joint = {}
    for seq in itertools.product(range(VOCAB), repeat=STEPS):
        ids = torch.cat([prompt, torch.tensor([seq[:-1]])], dim=1)
        with torch.no_grad():
            logits = target(ids).logits[0, prompt.shape[1] - 1 :]
        probs = target_probs(logits, params)
        joint[seq] = math.prod(float(probs[i, tok]) for i, tok in enumerate(seq))
    return joint


@pytest.mark.parametrize(
    ("method", "temperature", "top_k", "top_p"),
    [("reanchor", 1.0, None, None), ("reanchor", 0.7, 3, 0.9), ("dflash", 1.3, None, None)],
)
def test_first_tokens_follow_the_target_distribution(method, temperature, top_k, top_p):
    target = tiny_target("llama", vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    drafter = tiny_drafter(target, block_size=4, seed=5)
    gen = SpeculativeGenerator(target, drafter, ReAnchorConfig(offsets=(1, 2), node_budget=16))
    prompt = torch.tensor([[1, 3, 0]])
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    joint = exact_joint(target, prompt, params)
    trials = 800
    counts = Counter()
    for seed in range(trials):
        out = gen.generate(prompt, STEPS, method=method, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        counts[tuple(out.tokens)] += 1
    assert sum(counts.values()) == trials and all(len(k) == STEPS for k in counts)
    for seq, p in joint.items():
        freq = counts[seq] / trials
        assert abs(freq - p) <= 4.5 * math.sqrt(p * (1 - p) / trials) + 2 / trials, (seq, freq, p)


def test_same_seed_same_tokens():
    target = tiny_target("qwen3", vocab_size=8, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=0)
    gen = SpeculativeGenerator(target, tiny_drafter(target, block_size=6), ReAnchorConfig())
    a = gen.generate([1, 2, 3], 20, temperature=0.9, seed=7)
    b = gen.generate([1, 2, 3], 20, temperature=0.9, seed=7)
    assert a.tokens == b.tokens


def test_a_seed_reproduces_the_random_attachment_policy():
    target = tiny_target("llama", vocab_size=4, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=2)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    drafter = tiny_drafter(target, block_size=8, seed=4)
    config = ReAnchorConfig(offsets=(1, 2, 3), policy="random", node_budget=60)
    gen = SpeculativeGenerator(target, drafter, config)  # one engine: its default tree stream moves on

    def trees(seed):
        out = gen.generate([1, 2, 3], 60, temperature=0.8, seed=seed, trace=True)
        return out.tokens, [r.tree.parents.tolist() for r in out.rounds]

    first, again, other = trees(11), trees(11), trees(12)
    assert first == again
    assert first != other  # and the seed matters


def exact_pair_marginal(target, prompt, params, steps):
    """P(tokens steps-1 and steps of the continuation) by enumerating every prefix, [V, V]."""
    probs = {(): 1.0}
    for _ in range(steps):
        prefixes = list(probs)
        grown = torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)
        ids = torch.cat([prompt.expand(len(prefixes), -1), grown], 1)
        with torch.no_grad():
            nxt = target_probs(target(ids).logits[:, -1], params)
        probs = {p + (t,): probs[p] * float(nxt[i, t]) for i, p in enumerate(prefixes) for t in range(VOCAB)}
    pair = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for seq, p in probs.items():
        pair[seq[-2], seq[-1]] += p
    return pair


@pytest.mark.parametrize(("budget", "threshold"), [(False, None), (True, None), (False, 0.3)],
                         ids=["fixed-budget", "budget-policy", "verify-threshold"])
def test_tokens_decided_by_shifted_rows_follow_the_target_distribution(budget, threshold):
    """Later tokens (5 and 6), emitted in rounds whose trees hold shifted rows, and
    often accepted through them, have the target's joint distribution (also with rows cut
    where the drafter's confidence runs out)."""
    from sglang_reanchor.budget import BudgetPolicy

    steps = 6
    target = tiny_target("llama", vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    drafter = tiny_drafter(target, block_size=4, seed=5)
    policy = BudgetPolicy(verify_seconds={1: 1.0, 4: 1.0, 24: 1.5}, candidates=(3, 8, 24), explore_every=2) if budget else None
    config = ReAnchorConfig(offsets=(1, 2), policy="offset", node_budget=24, verify_threshold=threshold)
    gen = SpeculativeGenerator(target, drafter, config, budget_policy=policy)
    prompt = torch.tensor([[1, 3, 0]])
    params = SamplingParams(temperature=1.0)
    pair = exact_pair_marginal(target, prompt, params, steps)
    trials, counts, shifted = 800, Counter(), 0
    for seed in range(trials):
        out = gen.generate(prompt, steps, method="reanchor", temperature=1.0, seed=seed)
        counts[tuple(out.tokens[-2:])] += 1
        shifted += sum(out.shifted_accepts) > 0
    assert shifted >= trials // 10, shifted  # shifted-row nodes really decided tokens in many runs
    assert sum(counts.values()) == trials and all(len(k) == 2 for k in counts)
    for a in range(VOCAB):
        for b in range(VOCAB):
            p, freq = float(pair[a, b]), counts[(a, b)] / trials
            assert abs(freq - p) <= 4.5 * math.sqrt(p * (1 - p) / trials) + 2 / trials, ((a, b), freq, p)
