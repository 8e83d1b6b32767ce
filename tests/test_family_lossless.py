"""Lossless with Domino and DSpark drafters: the reference engine's ``dflash`` and ``reanchor``.

Like test_engine_lossless.py for DFlash: random tiny targets (Llama or Qwen3), random
family drafters (random-weight heads of every kind) written in SGLang's format and
loaded back, random ReAnchor configurations (half of them branching on the head's runner-up
tokens); at T=0 the tokens equal Hugging Face's
greedy decoding. At T>0 a seeded run equals plain seeded decoding, and the first tokens
follow the target's exact distribution.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch
from factories import tiny_domino_drafter, tiny_dspark_drafter, tiny_target
from test_engine_lossless import POLICIES, hf_greedy
from test_engine_sampling import STEPS, VOCAB, exact_joint

from sglang_reanchor import DFlashDrafter, ReAnchorConfig, SamplingParams, SpeculativeGenerator

NUM_CASES = 24  # per family
STATS: dict[tuple[str, int], tuple[int, ...]] = {}  # (family, case) -> reanchor's (rounds, deep, shifted, branched)


def reanchor_stats(result) -> tuple[int, ...]:
    """Rounds, rounds that accepted >= 2 drafts, tokens accepted through shifted rows and through branches."""
    return (len(result.acceptance_lengths), sum(t >= 3 for t in result.acceptance_lengths),
            sum(result.shifted_accepts), sum(result.branch_accepts))


def family_drafter(family: str, target, rng: random.Random, block: int, seed: int):
    """A random Domino or DSpark drafter for ``target`` (every head option drawn from ``rng``)."""
    layers = target.config.num_hidden_layers
    common = dict(block_size=block, num_layers=rng.choice([1, 2]), seed=seed,
                  target_layer_ids=sorted(rng.sample(range(layers), rng.randint(1, layers))))
    if family == "domino":
        drafter = tiny_domino_drafter(target, shift_label=rng.random() < 0.5, gru_hidden_dim=rng.choice([3, 8]),
                                      emb_dim=rng.choice([4, 12]), **common)
    else:
        drafter = tiny_dspark_drafter(target, markov_head_type=rng.choice(["vanilla", "gated", "rnn"]),
                                      markov_rank=rng.choice([2, 5, target.config.vocab_size + 1]),
                                      sample_from_anchor=rng.random() < 0.5, confidence_head=rng.random() < 0.5,
                                      **common)
    return drafter


def fit_markov_bigrams(drafter, tokens: list[int], strength: float = 3.0) -> None:
    """Set a DSpark head of rank > V to bias ``prev -> next`` by the bigram frequencies of
    ``tokens`` (a trained head's kind of transition table), so that its drafts get accepted
    often and the cases below exercise deep acceptance and shifted rows, not only rejection."""
    m, vocab = drafter.markov_head, drafter.config.vocab_size
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for prev, nxt in zip(tokens, tokens[1:]):
        counts[nxt, prev] += 1
    table = strength * counts / counts.sum(0).clamp(min=1)  # [next, prev]
    with torch.no_grad():
        m.markov_w1.weight.zero_()
        m.markov_w1.weight[:, :vocab] = torch.eye(vocab)  # w1[prev] = e_prev
        m.markov_w2.weight.zero_()
        m.markov_w2.weight[:, :vocab] = table
        if drafter.dspark.markov_head_type == "gated":
            m.gate_proj.weight.zero_()
            m.gate_proj.bias.fill_(4.0)  # gate ~ 1
        if drafter.dspark.markov_head_type == "rnn":  # tanh(output) ~ e_prev
            r = m.markov_rank
            m.joint_proj.weight[2 * r:].zero_()
            m.joint_proj.weight[2 * r:, r:2 * r] = 5.0 * torch.eye(r)
            m.joint_proj.bias[2 * r:].zero_()
            m.markov_w2.weight.div_(torch.tanh(torch.tensor(5.0)))


def make_case(family: str, case: int, tmp_path):
    rng = random.Random(7919 * case + (family == "dspark"))
    arch = ("llama", "qwen3")[case % 2]
    vocab = rng.choice([4, 5, 6, 8, 12])
    block = rng.randint(3, 12)
    target = tiny_target(arch, vocab_size=vocab, hidden_size=16, num_layers=rng.choice([2, 3]), num_heads=2,
                         num_kv_heads=1, seed=case, attn_implementation=rng.choice(["sdpa", "eager"]))
    if rng.random() < 0.7:
        target.generation_config.eos_token_id = target.config.eos_token_id = None
    prompt = torch.randint(0, vocab, (1, rng.randint(1, 10)), generator=torch.Generator().manual_seed(case))
    drafter = family_drafter(family, target, rng, block, seed=2000 + case)
    if family == "dspark" and drafter.dspark.markov_rank > vocab:
        fit_markov_bigrams(drafter, hf_greedy(target, prompt, 48))
    drafter.save_pretrained(tmp_path / "drafter")
    drafter = DFlashDrafter.from_pretrained(tmp_path / "drafter", dtype=torch.float64)
    if family == "domino":
        drafter.head.candidate_pool_size = rng.choice([0, 2, 2048])
    width = drafter.block_size
    config = ReAnchorConfig(
        offsets=tuple(sorted(rng.sample(range(1, width), rng.randint(1, min(4, width - 1))))),
        policy=POLICIES[(case // 2) % len(POLICIES)], root_site=rng.random() < 0.5,
        fallback=rng.choice(["skip", "offset"]), node_budget=rng.choice([width, width + 3, 2 * width, 200]),
        region=rng.choice(["all", "all", "in_block", "beyond"]), seed=case)
    if rng.random() < 1 / 3:
        config = config.replace(max_depth=rng.choice([1, 2, width - 1, width + 2]),
                                draft_slots=rng.choice([None, 2, width // 2 + 1, width]))
    draft_vocab = torch.randperm(vocab)[: rng.randint(2, vocab)] if rng.random() < 0.25 else None
    sure = random.Random(30_000 + case)  # cut rows where the drafter's confidence runs out (own stream)
    if sure.random() < 0.3:
        config = config.replace(verify_threshold=sure.choice([0.05, 0.2, 0.5, 0.9, 1.0]))
    branch = random.Random(20_000 + case)  # half the cases branch on the head's runner-up tokens (own stream)
    if branch.random() < 0.5:
        config = config.replace(branch_width=branch.choice([1, 2, 3]), branch_rows=branch.choice([1, 3, 8]),
                                branch_length=branch.choice([1, 2, 4]), branch_temperature=branch.choice([0.5, 1.0, 3.0]),
                                branch_shape=branch.choice(["chains", "best_first"]))
    return target, drafter, config, draft_vocab, prompt, rng.choice([1, 7, 33, 48])


@pytest.mark.parametrize("family", ["domino", "dspark"])
@pytest.mark.parametrize("case", range(NUM_CASES))
def test_family_tokens_equal_hf_greedy(family, case, tmp_path):
    target, drafter, config, draft_vocab, prompt, max_new = make_case(family, case, tmp_path)
    assert drafter.family == family
    expected = hf_greedy(target, prompt, max_new)
    gen = SpeculativeGenerator(target, drafter, config, draft_vocab=draft_vocab)
    for method in ("dflash", "reanchor"):
        result = gen.generate(prompt, max_new, method=method)
        assert result.tokens == expected, (method, config)
        assert sum(result.acceptance_lengths) >= len(result.tokens) - 1
    assert len(gen.suffixes) == 0
    if config.verify_threshold is None:  # the stats are of uncut trees
        STATS[family, case] = reanchor_stats(result)


@pytest.mark.parametrize("family", ["domino", "dspark"])
def test_family_cases_accept_drafts_through_shifted_rows(family, tmp_path):
    """The cases above are not vacuous: the family heads' drafts get accepted, some via shifted rows,
    some via branches.
    (Reads the runs of the test above when they ran in this session, else runs the cases; trees
    uncut by ``verify_threshold``, whose cases `test_engine_lossless` checks are cut.)"""
    for case in range(NUM_CASES):
        if (family, case) not in STATS:
            target, drafter, config, draft_vocab, prompt, max_new = make_case(family, case, tmp_path)
            STATS[family, case] = reanchor_stats(SpeculativeGenerator(
                target, drafter, config.replace(verify_threshold=None), draft_vocab=draft_vocab,
            ).generate(prompt, max_new, method="reanchor"))
    rounds, deep, shifted, branched = (sum(STATS[family, c][i] for c in range(NUM_CASES)) for i in range(4))
    assert rounds > 150 and deep >= 10 and shifted >= 5 and branched >= 5, (rounds, deep, shifted, branched)


@pytest.mark.parametrize("family", ["domino", "dspark"])
@pytest.mark.parametrize("case", range(4))
def test_a_seed_gives_plain_decodings_tokens_with_family_drafters(family, case, tmp_path):
    target, drafter, config, draft_vocab, prompt, _ = make_case(family, 100 + case, tmp_path)
    gen = SpeculativeGenerator(target, drafter, config, draft_vocab=draft_vocab)
    sampling = dict(temperature=(0.6, 1.0, 1.5)[case % 3], top_k=(None, 3)[case % 2])
    for seed in (case, 1000 + case):
        plain = gen.generate(prompt, 40, method="target", seed=seed, **sampling)
        for method in ("dflash", "reanchor"):
            assert gen.generate(prompt, 40, method=method, seed=seed, **sampling).tokens == plain.tokens, (method, seed)


@pytest.mark.parametrize("family", ["domino", "dspark"])
@pytest.mark.parametrize("branch_width,shape", [(0, "chains"), (2, "chains"), (2, "best_first")])
def test_first_tokens_follow_the_target_distribution_with_family_drafters(family, branch_width, shape):
    target = tiny_target("llama", vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    make = tiny_domino_drafter if family == "domino" else tiny_dspark_drafter
    config = ReAnchorConfig(offsets=(1, 2), node_budget=16, branch_width=branch_width, branch_rows=3,
                            branch_shape=shape)
    gen = SpeculativeGenerator(target, make(target, block_size=4, seed=5), config)
    prompt, params = torch.tensor([[1, 3, 0]]), SamplingParams(temperature=1.0)
    joint = exact_joint(target, prompt, params)
    trials, counts = 400, Counter()  # (test_engine_sampling.py runs 800 per case for DFlash drafters)
    for seed in range(trials):
        counts[tuple(gen.generate(prompt, STEPS, method="reanchor", temperature=1.0, seed=seed).tokens)] += 1
    assert sum(counts.values()) == trials
    for seq, p in joint.items():
        freq = counts[seq] / trials
        assert abs(freq - p) <= 4.5 * math.sqrt(p * (1 - p) / trials) + 2 / trials, (seq, freq, p)
