"""`BatchBudget`: the server's per-request node budget as the batch grows (pure python/torch)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.budget import BatchBudget

# a CPU-like verify curve: nearly flat up to 8 tokens, then linear (seconds)
VERIFY = {1: 0.050, 8: 0.060, 16: 0.085, 32: 0.105, 64: 0.15, 128: 0.26, 256: 0.50}
DRAFT = {1: 0.012, 4: 0.030, 16: 0.090, 64: 0.33}


def learnt(tau: dict[int, float], **kwargs) -> BatchBudget:
    budget = BatchBudget(VERIFY, DRAFT, blocks_per_request=4, **kwargs)
    budget.tau.update(tau)
    budget.rounds = 1  # past the first (exploration) round
    return budget


def test_full_tree_alone_and_the_root_alone_in_a_big_batch():
    budget = learnt({2: 1.5, 4: 1.8, 8: 2.0, 16: 2.1}, candidates=(2, 4, 8, 16))
    assert budget.choose(1) == 8  # 2.0 / 0.090 beats 2.1 / 0.115 and 1.8 / 0.082
    chosen = [budget.choose(bs) for bs in (1, 2, 4, 8, 16, 32)]
    assert chosen == sorted(chosen, reverse=True)  # shrinks as the batch grows ...
    assert chosen[-1] == 1  # ... down to plain decoding's cost: no drafter forward
    assert budget.round_seconds(32, 1) == pytest.approx(0.105)


def test_expected_rates_are_what_the_choice_compares():
    """The trace records `expected_rates` beside each round: they are the tokens/s `choose`
    maximises, corrected by the round times `record_seconds` measured."""
    budget = learnt({2: 1.5, 4: 1.8, 8: 2.0, 16: 2.1}, candidates=(2, 4, 8, 16))
    for bs in (1, 2, 8):
        rates = budget.expected_rates(bs)
        assert set(rates) == {1, 2, 4, 8, 16}
        assert rates[4] == pytest.approx(bs * 1.8 / budget.predicted_seconds(bs, 4))
        assert budget.choose(bs) == max(rates, key=rates.__getitem__)
    for _ in range(2):  # (the first round of each is a warm-up, not recorded)
        budget.record_seconds(1, 8, 3 * budget.predicted_seconds(1, 8))  # the server's rounds of 8 run 3x slower,
        budget.record_seconds(1, 4, budget.predicted_seconds(1, 4))  # its rounds of 4 as the profile says
    assert budget.expected_rates(1)[8] == pytest.approx(2.0 / (3 * budget.predicted_seconds(1, 8)))
    assert budget.choose(1) != 8


def test_a_cold_first_round_does_not_stop_exploration():
    """Served on a CPU: the server's first round (a 6-node tree, its drafts wrong) took 2.9x the
    profile's time, as new shapes do; recorded, that one figure made every tree look too dear to
    explore and the server verified the root alone for the rest of its life. Not recorded, the
    next exploration rounds measure trees again."""
    budget = BatchBudget(VERIFY, DRAFT, blocks_per_request=2, candidates=(2, 4, 6), decay=0.9)
    assert budget.choose(1) == 6
    budget.observe(torch.tensor([[0, -1, -1]]), budget=6)  # tau 1 at every budget
    budget.record_seconds(1, 6, 2.9 * budget.predicted_seconds(1, 6))
    chosen = []
    for _ in range(24):
        b = budget.choose(1)
        chosen.append(b)
        budget.observe(torch.tensor([[0, 1, -1]] if b > 1 else [[0, -1, -1]]), budget=b)  # trees take 2 now
        budget.record_seconds(1, b, 0.75 * budget.predicted_seconds(1, b))
    assert any(b > 1 for b in chosen[:8])  # explored within explore_every rounds ...
    assert chosen[-1] > 1  # ... and, at tau 2 for 1.3x the time, chosen


def test_a_drafter_that_is_never_right_gets_the_root_alone():
    budget = learnt({2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}, candidates=(2, 4, 8, 16))
    assert all(budget.choose(bs) == 1 for bs in (1, 4, 16))


def test_observe_learns_tau_of_every_smaller_budget_from_one_round():
    budget = BatchBudget(VERIFY, DRAFT, blocks_per_request=2, candidates=(2, 4, 8), decay=0.0, explore_cost=2.0)
    assert budget.choose(1) == 8  # first round: exploration, the largest affordable candidate
    paths = torch.tensor([[0, 1, 5, -1], [0, 3, -1, -1]])  # node ids on the accepted paths, -1 padded
    budget.observe(paths, budget=8)
    assert budget.tau == {1: 1.0, 2: 1.5, 4: 2.0, 8: 2.5}
    budget.observe(torch.tensor([[0, 1, -1, -1]]), budget=2)  # a budget-2 round teaches nothing about 4 or 8
    assert budget.tau == {1: 1.0, 2: 2.0, 4: 2.0, 8: 2.5}


def test_exploration_stays_inside_the_measured_curve():
    budget = BatchBudget(VERIFY, DRAFT, blocks_per_request=4, candidates=(2, 4, 8, 16), explore_cost=100.0)
    assert budget.choose(1) == 16 and budget.choose(16) == 16 and budget.choose(32) == 8
    assert budget.choose(512) == 1


def test_exploration_costs_at_most_explore_cost_rounds():
    """A big batch that pays for the root alone never verifies wide trees to explore them
    (served on a CPU, exploring 8 nodes each for 16 requests every 8th round cost more than
    the budget won); alone, a request explores its widest tree every ``explore_every`` rounds."""
    budget = learnt({2: 1.5, 4: 1.8, 8: 2.0, 16: 2.1}, candidates=(2, 4, 8, 16))
    rounds = range(1, 33)
    big = []
    for r in rounds:
        budget.rounds = r
        big.append(budget.choose(16))
    assert set(big) == {1}
    cost = {b: budget.round_seconds(1, b) for b in budget.candidates}
    alone = []
    for r in rounds:
        budget.rounds = r
        alone.append(budget.choose(1))
    wide = max(b for b in budget.candidates if cost[b] <= 1.5 * cost[8])
    assert alone.count(wide) == 4 and set(alone) == {8, wide} and wide > 8  # rounds 8, 16, 24, 32
    fresh = BatchBudget(VERIFY, DRAFT, blocks_per_request=4, candidates=(2, 4, 8, 16), decay=0.0)
    assert fresh.choose(16) == 16  # nothing known: once, the widest inside the curve (16 x 16 = 256 tokens)
    fresh.observe(torch.tensor([[0, 1, 2, -1]] * 16), budget=16)  # tau 3 at every b >= 3
    assert fresh.tau == {1: 1.0, 2: 2.0, 4: 3.0, 8: 3.0, 16: 3.0}
    assert fresh.choose(16) == 1 and fresh.choose(1) == 4  # the best known, no exploration until round 8
    with pytest.raises(ValueError, match="explore_cost"):
        BatchBudget(VERIFY, DRAFT, blocks_per_request=1, explore_cost=0.5)


def test_exploration_backs_off_while_it_loses_and_returns_when_it_pays():
    """Where a tree round passes the cost bound and still loses, exploring it every 8th round costs up to
    1.5x on one round in 8: an exploration round that delivers less than the chosen budget was expected
    to doubles that batch size's interval, up to ``max_explore_every``; one that beats it restores
    ``explore_every``."""
    budget = learnt({2: 1.1, 4: 1.2, 8: 1.3, 16: 1.3}, candidates=(2, 4, 8, 16), explore_cost=3.0, max_explore_every=32)
    bs = 1

    def run(rounds: int, accepted: int) -> list[int]:
        chosen = []
        for _ in range(rounds):
            b = budget.choose(bs)
            chosen.append(b)
            path = [0] + list(range(1, accepted)) + [-1] * (4 - accepted)
            budget.observe(torch.tensor([path] * bs), budget=b)
        return chosen

    losing = run(160, accepted=1)  # the drafts are never right: every exploration loses
    explored = [i + 1 for i, b in enumerate(losing) if b > 1]  # rounds (1-based) that explored
    assert set(losing[i - 1] for i in explored) == {16} and budget.choose(bs) == 1  # the root chosen
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert gaps[:3] == [8, 16, 32] and set(gaps[2:]) == {32}  # at rounds 8, 16, 32, 64, 96: doubling up to 32
    assert budget.explore_gap == {bs: 32}  # per batch size
    run(40, accepted=4)  # the text turns easy: the exploration of round 192 pays, and the interval is 8 again
    assert budget.explore_gap[bs] == 8
    assert run(16, accepted=4)[-1] > 1  # ... and trees are chosen
    with pytest.raises(ValueError, match="max_explore_every"):
        BatchBudget(VERIFY, DRAFT, blocks_per_request=1, explore_every=16, max_explore_every=8)


@settings(max_examples=60, deadline=None)
@given(taus=st.lists(st.floats(1.0, 4.0), min_size=4, max_size=4), bs=st.integers(1, 48))
def test_the_choice_is_the_best_predicted_throughput(taus, bs):
    taus = sorted(taus)  # tau(b) grows with b
    budget = learnt(dict(zip((2, 4, 8, 16), taus)), candidates=(2, 4, 8, 16))
    best = budget.choose(bs)
    rate = {b: bs * budget.tau[b] / budget.round_seconds(bs, b) for b in budget.candidates}
    assert rate[best] == max(rate.values())


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="verify_seconds"):
        BatchBudget({}, DRAFT, blocks_per_request=1)
    with pytest.raises(ValueError, match="candidates"):
        BatchBudget(VERIFY, DRAFT, blocks_per_request=1, candidates=(0, 4))


def test_measured_round_times_correct_the_profile():
    """Serving adds a fixed cost per round the profile does not see: rounds of the root alone
    measured at twice the predicted time make a tree worth it again for a request alone."""
    budget = learnt({2: 1.3, 4: 1.5, 8: 1.6, 16: 1.6}, candidates=(2, 4, 8, 16))
    assert budget.choose(1) == 1  # the profile alone: 1.6 / 0.090 < 1 / 0.050
    budget.record_seconds(1, 1, 5.0)  # the first round of a shape is a warm-up: not recorded
    budget.record_seconds(1, 8, 5.0)
    assert budget.correction == {} and budget.choose(1) == 1
    budget.record_seconds(1, 1, 0.100)  # ... but the root alone takes 0.100 s here
    budget.record_seconds(1, 8, 0.108)  # and the 8-node round 0.108 (1.2x its prediction)
    assert budget.correction == {(1, 1): pytest.approx(2.0), (1, 8): pytest.approx(1.2)}
    assert budget.choose(1) == 8
    assert budget.round_seconds(1, 4) == pytest.approx(budget.predicted_seconds(1, 4) * 1.6)  # the mean
    assert budget.round_seconds(4, 8) == pytest.approx(budget.predicted_seconds(4, 8) * 1.2)  # this budget's
    for _ in range(2):
        budget.record_seconds(4, 8, budget.predicted_seconds(4, 8) * 3.0)  # a batch of 4 pays more per node
    assert budget.round_seconds(4, 8) == pytest.approx(budget.predicted_seconds(4, 8) * 3.0)
    assert budget.round_seconds(1, 8) == pytest.approx(budget.predicted_seconds(1, 8) * 1.2)  # alone: as before
