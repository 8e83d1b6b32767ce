"""The invariant: at T=0 `dflash` and `reanchor` emit exactly the target's greedy tokens.

Each case builds a random tiny target (Llama or Qwen3, tiny vocabulary so drafts
are accepted often and trees go deep), writes a random z-lab-format drafter to
disk and loads it back, and compares against Hugging Face ``generate``.
"""

from __future__ import annotations

import random

import pytest
import torch
from factories import tiny_drafter, tiny_target, write_zlab_drafter

from sglang_reanchor import DFlashDrafter, ReAnchorConfig, SpeculativeGenerator

POLICIES = ("earliest", "offset", "random", "longest_prefix")
NUM_CASES = 48


def make_case(case: int, tmp_path):
    """A random (target, drafter, config, prompt, max_new, eos) case, seeded by ``case``."""
    rng = random.Random(case)
    family = ("llama", "qwen3")[case % 2]
    vocab = rng.choice([4, 5, 6, 8, 12])
    block = rng.randint(4, 16)
    target = tiny_target(
        family, vocab_size=vocab, hidden_size=16, num_layers=rng.choice([2, 3]), num_heads=2, num_kv_heads=1,
        seed=case, attn_implementation=rng.choice(["sdpa", "eager"]),
    )
    use_eos = rng.random() < 0.3
    if not use_eos:  # most cases run to max_new_tokens so trees keep coming
        target.generation_config.eos_token_id = None
        target.config.eos_token_id = None
    layers = target.config.num_hidden_layers
    drafter = tiny_drafter(
        target, block_size=block, num_layers=rng.choice([1, 2]), seed=1000 + case,
        target_layer_ids=sorted(rng.sample(range(layers), rng.randint(1, layers))),
    )
    drafter = DFlashDrafter.from_pretrained(write_zlab_drafter(drafter, tmp_path / "drafter"), dtype=torch.float64)
    config = ReAnchorConfig(
        offsets=tuple(sorted(rng.sample(range(1, block), rng.randint(1, min(4, block - 1))))),
        policy=POLICIES[(case // 2) % len(POLICIES)],
        root_site=rng.random() < 0.5,
        fallback=rng.choice(["skip", "offset"]),
        node_budget=rng.choice([block, block + 3, 2 * block, 4 * block, 200]),
        region=rng.choice(["all", "all", "in_block", "beyond"]),
        seed=case,
    )
    gen = torch.Generator().manual_seed(case)
    prompt = torch.randint(0, vocab, (1, rng.randint(1, 10)), generator=gen)
    max_new = rng.choice([1, 7, 33, 48])
    # a third of the cases cap the depth, draft shortened blocks and/or cap the batch's nodes
    # (own stream: the draws above stay as they were)
    cut = random.Random(10_000 + case)
    if cut.random() < 1 / 3:
        config = config.replace(max_depth=cut.choice([1, 2, 3, block - 1, block + 2]),
                                draft_slots=cut.choice([None, 2, 3, block // 2 + 1, block]),
                                batch_node_budget=cut.choice([None, 1, 3, block]))
    # and two cases in five branch on the drafter's runner-up tokens (own stream again)
    branch = random.Random(20_000 + case)
    if branch.random() < 0.4:
        config = config.replace(branch_width=branch.choice([1, 2, 3]), branch_rows=branch.choice([1, 3, 8]),
                                branch_length=branch.choice([1, 2, 4]), branch_temperature=branch.choice([0.5, 1.0, 3.0]),
                                branch_shape=branch.choice(["chains", "best_first"]))
    # and three in ten cut rows where the drafter's confidence runs out (own stream)
    sure = random.Random(30_000 + case)
    if sure.random() < 0.3:
        config = config.replace(verify_threshold=sure.choice([0.05, 0.2, 0.5, 0.9, 1.0]))
    return target, drafter, config, prompt, max_new


def hf_greedy(target, prompt, max_new):
    out = target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new, do_sample=False,
        pad_token_id=target.config.pad_token_id,
    )
    return out[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("case", range(NUM_CASES))
def test_speculative_tokens_equal_hf_greedy(case, tmp_path):
    target, drafter, config, prompt, max_new = make_case(case, tmp_path)
    expected = hf_greedy(target, prompt, max_new)
    gen = SpeculativeGenerator(target, drafter, config)
    for method in ("target", "dflash", "reanchor"):
        result = gen.generate(prompt, max_new, method=method)
        assert result.tokens == expected, (method, config)
        assert len(result.tokens) <= max_new
        if method != "target":
            assert sum(result.acceptance_lengths) >= len(result.tokens) - 1  # the first token comes from prefill
            assert all(1 <= t <= 2 * drafter.block_size for t in result.acceptance_lengths)
            assert all(n <= max(config.node_budget, drafter.block_size) for n in result.tree_sizes)
            deepest = config.max_depth or 2 * drafter.block_size  # no tree node lies deeper
            if method == "dflash":  # nor any chain node past the drafted slots
                deepest = min(deepest, (config.draft_slots or drafter.block_size) - 1)
            assert all(t <= deepest + 1 for t in result.acceptance_lengths), (method, config)
    assert len(gen.suffixes) == 0  # every request's state is released


def test_cases_exercise_deep_trees_and_shifted_rows(tmp_path):
    """The lossless cases above are not vacuous: rounds accept several drafts, some via shifted rows,
    some via branches."""
    deep = shifted = branched = rounds = 0
    for case in range(NUM_CASES):
        target, drafter, config, prompt, max_new = make_case(case, tmp_path)
        config = config.replace(verify_threshold=None)  # the cases' trees uncut (cut ones: the next test)
        result = SpeculativeGenerator(target, drafter, config).generate(prompt, max_new, method="reanchor")
        rounds += len(result.acceptance_lengths)
        deep += sum(t >= 4 for t in result.acceptance_lengths)
        shifted += sum(result.shifted_accepts)
        branched += sum(result.branch_accepts)
    assert rounds > 300 and deep >= 20 and shifted >= 5 and branched >= 5, (rounds, deep, shifted, branched)


def test_verify_threshold_cases_cut_their_trees(tmp_path):
    """The cases with a ``verify_threshold`` verify fewer nodes than the same configs without it,
    and still accept several drafts in some rounds (where the drafter is sure)."""
    cut = full = deep = cases = 0
    for case in range(NUM_CASES):
        target, drafter, config, prompt, max_new = make_case(case, tmp_path)
        if config.verify_threshold is None:
            continue
        cases += 1
        gen = SpeculativeGenerator(target, drafter, config)
        for method in ("dflash", "reanchor"):
            ours = gen.generate(prompt, max_new, method=method)
            uncut = SpeculativeGenerator(target, drafter, config.replace(verify_threshold=None)).generate(
                prompt, max_new, method=method)
            assert ours.tokens == uncut.tokens
            cut, full = cut + sum(ours.tree_sizes), full + sum(uncut.tree_sizes)
            deep += sum(t >= 3 for t in ours.acceptance_lengths)
    assert cases >= 10 and cut < 0.8 * full and deep >= 5, (cases, cut, full, deep)


def test_cut_branches_are_lossless_and_accepted(tmp_path):
    """Branches cut by ``verify_threshold`` (`branching`): tokens equal HF greedy, the cut drops
    branch nodes, and some rounds still accept a branch (the random cases' drafters are too unsure
    for their thresholds to keep any)."""
    accepted = cut = full = 0
    for case in range(0, NUM_CASES, 4):
        target, drafter, config, prompt, max_new = make_case(case, tmp_path)
        config = config.replace(branch_width=2, branch_rows=8, branch_length=3, verify_threshold=0.02)
        ours = SpeculativeGenerator(target, drafter, config).generate(prompt, max_new, method="reanchor")
        assert ours.tokens == hf_greedy(target, prompt, max_new), config
        uncut = SpeculativeGenerator(target, drafter, config.replace(verify_threshold=None)).generate(
            prompt, max_new, method="reanchor")
        accepted += sum(ours.branch_accepts)
        cut += sum(ours.tree_sizes) / max(len(ours.tree_sizes), 1)  # nodes a round (none: max_new = 1)
        full += sum(uncut.tree_sizes) / max(len(uncut.tree_sizes), 1)
    assert accepted >= 3 and cut < 0.8 * full, (accepted, cut, full)


def test_eos_stops_generation():
    """Output ends at the first EOS exactly like HF generate, whichever round it falls in."""
    for seed in range(10):
        target = tiny_target("qwen3", vocab_size=6, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=seed)
        drafter = tiny_drafter(target, block_size=6, seed=seed)
        prompt = torch.tensor([[1, 3, 0, 3, 5]])
        target.generation_config.eos_token_id = target.config.eos_token_id = None
        free_run = hf_greedy(target, prompt, 30)
        eos = free_run[seed % 8]  # a token the target does emit
        target.generation_config.eos_token_id = target.config.eos_token_id = eos
        expected = hf_greedy(target, prompt, 30)
        assert expected[-1] == eos and len(expected) <= seed % 8 + 1
        gen = SpeculativeGenerator(target, drafter, ReAnchorConfig())
        for method in ("target", "dflash", "reanchor"):
            result = gen.generate(prompt, 30, method=method)
            assert result.tokens == expected, method
            assert result.finish_reason == "eos"
