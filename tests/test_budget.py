"""Run-time node budget: the counterfactual it relies on, its choice, and exact output."""

from __future__ import annotations

import pytest
import torch
from factories import tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tree import build, tree_inputs

from sglang_reanchor import BudgetPolicy, ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.budget import interpolate
from sglang_reanchor.verify import accept_tree


def _target_picks(tree, b: int, seed: int) -> torch.Tensor:
    """A deterministic 'target' for request ``b``: its pick after a node depends only on
    the node's root path (as a real model's argmax does); it often agrees with a child."""
    tokens, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
    n = int(tree.num_nodes[b])
    picks = []
    for i in range(n):
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        h = hash((seed, tuple(path))) % 1000
        kids = [tokens[k] for k in range(n) if parents[k] == i]
        picks.append(kids[h % len(kids)] if kids and h < 800 else h % 7)
    return torch.tensor(picks + [0] * (tree.tokens.shape[1] - n))


@settings(max_examples=150, deadline=None)
@given(tree_inputs(), st.integers(0, 10**6), st.data())
def test_a_smaller_budget_accepts_the_big_paths_nodes_below_it(inputs, seed, data):
    """The premise of `budget`: at T=0, the tree under budget b accepts exactly the nodes
    with id < b of the path accepted under a larger budget B."""
    baseline, shifted, offsets, valid, rejected, cfg = inputs
    big = build(*inputs)
    small_b = data.draw(st.integers(1, cfg.node_budget))
    small = build(baseline, shifted, offsets, valid, rejected, cfg.replace(node_budget=small_b))
    for b in range(big.batch_size):
        picks = _target_picks(big, b, seed)[None]
        acc = accept_tree(_one(big, b), picks, picks)
        n_small = int(small.num_nodes[b])
        assert small.tokens[b, :n_small].tolist() == big.tokens[b, :n_small].tolist()  # a prefix by id
        acc_small = accept_tree(_one(small, b), picks[:, : small.tokens.shape[1]], picks[:, : small.tokens.shape[1]])
        path = acc.accepted_nodes[0, : int(acc.accept_lengths[0])]
        want = path[path < small_b].tolist()
        assert acc_small.accepted_nodes[0, : int(acc_small.accept_lengths[0])].tolist() == want


def _one(tree, b):
    from sglang_reanchor.tree import DraftTree

    return DraftTree(**{f: getattr(tree, f)[b: b + 1] for f in DraftTree.__dataclass_fields__})


def test_interpolate_and_validation():
    assert interpolate({1: 1.0, 3: 3.0}, 2) == 2.0 and interpolate({1: 1.0, 3: 3.0}, 5) == 5.0
    assert interpolate({4: 2.0}, 100) == 2.0
    with pytest.raises(ValueError, match="verify_seconds"):
        BudgetPolicy(verify_seconds={})
    with pytest.raises(ValueError, match="candidates"):
        BudgetPolicy(verify_seconds={1: 1.0}, candidates=(0, 8))
    with pytest.raises(ValueError, match="decay"):
        BudgetPolicy(verify_seconds={1: 1.0}, decay=1.0)
    with pytest.raises(ValueError, match="explore_every"):
        BudgetPolicy(verify_seconds={1: 1.0}, explore_every=0)


def test_choice_maximises_predicted_tokens_per_second():
    # verify cost: flat up to 16 nodes, then 1 s per 16 more (a CPU-like curve)
    policy = BudgetPolicy(verify_seconds={1: 1.0, 16: 1.0, 64: 4.0}, fixed_seconds=0.5,
                          candidates=(16, 32, 64), explore_every=4, decay=0.0)
    state = policy.start()
    assert state.next_budget() == 64  # nothing known yet: explore
    # accepted path through nodes 0, 3, 20, 40: tau 2 at 16, 3 at 32, 4 at 64
    state.observe(torch.tensor([0, 3, 20, 40]), 64, 64)
    rates = {16: 2 / 1.5, 32: 3 / 2.5, 64: 4 / 4.5}
    assert state.next_budget() == max(rates, key=rates.get) == 16
    state.observe(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8]), 16, 16)  # only b <= 16 learn
    assert state.tau == {16: 9.0, 32: 3.0, 64: 4.0}
    state.observe(torch.tensor([0]), 16, 16)
    state.observe(torch.tensor([0]), 16, 16)
    assert state.next_budget() == 64  # every 4th round explores
    # a tree smaller than the budget costs what it verifies
    state.observe(torch.tensor([0, 1, 2, 3, 17, 18, 19, 20]), 64, 24)
    assert state.nodes == {16: 16.0, 32: 24.0, 64: 24.0}
    assert state.next_budget() == 32  # tau 8 for 32 or 64 at the cost of 24 nodes: the smaller wins ties


CASES = [  # (model type, vocab, block, offsets, policy, seed)
    ("llama", 12, 6, (1, 2), "offset", 5),
    ("llama", 8, 4, (1, 2, 3), "earliest", 11),
    ("qwen3", 10, 8, (1,), "longest_prefix", 7),
    ("qwen3", 9, 5, (1, 3), "random", 4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-v{c[1]}-B{c[2]}-{c[4]}")
def test_engine_with_a_budget_policy_is_exact(case):
    # (at T>0 the distribution is checked in test_engine_sampling.py, with and without a policy)
    temperature = 0.0
    kind, vocab, block, offsets, policy_name, model_seed = case
    target = tiny_target(kind, vocab_size=vocab, seed=model_seed)
    drafter = tiny_drafter(target, block_size=block, target_layer_ids=[0, 1], seed=model_seed + 1)
    cfg = ReAnchorConfig(offsets=offsets, policy=policy_name, node_budget=48)
    policy = BudgetPolicy(verify_seconds={1: 1.0, block: 1.0, 4 * block: 2.0},
                          candidates=(block - 2, block, 2 * block, 4 * block), explore_every=3)
    seen, rounds = set(), 0
    for seed in range(6):
        prompt = torch.randint(3, vocab, (1, 5), generator=torch.Generator().manual_seed(seed))[0].tolist()
        fixed = SpeculativeGenerator(target, drafter, cfg).generate(prompt, 30, temperature=temperature, seed=seed)
        auto = SpeculativeGenerator(target, drafter, cfg, budget_policy=policy)
        got = auto.generate(prompt, 30, temperature=temperature, seed=seed)
        if temperature == 0:
            ids = torch.tensor([prompt])
            ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                                  pad_token_id=target.config.pad_token_id)[0, len(prompt):].tolist()
            assert got.tokens == fixed.tokens == ref
        seen |= set(got.tree_sizes)
        rounds += len(got.tree_sizes)
        assert all(n <= 4 * block for n in got.tree_sizes)
    # many rounds; the budget really changed between them (cut chains below B, explored trees above 2B)
    assert rounds > 20 and len(seen) > 1
