"""ReAnchorConfig validation and the bounded rejected-suffix store."""

from __future__ import annotations

import pytest
import torch

from sglang_reanchor import ReAnchorConfig, RejectedSuffix, SuffixStore


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(offsets=(0, 1)), "offsets"),
        (dict(offsets=(2, 2)), "offsets"),
        (dict(offsets=3), "offsets"),
        (dict(offsets=(1.5,)), "offsets"),
        (dict(policy="latest"), "policy"),
        (dict(fallback="drop"), "fallback"),
        (dict(region="inside"), "region"),
        (dict(root_site="yes"), "root_site"),
        (dict(node_budget=0), "node_budget"),
        (dict(node_budget=True), "node_budget"),
        (dict(max_requests=0), "max_requests"),
        (dict(seed="x"), "seed"),
        (dict(batch_node_budget=0), "batch_node_budget"),
        (dict(disable_by_batch_size=0), "disable_by_batch_size"),
        (dict(disable_by_batch_size=2.0), "disable_by_batch_size"),
    ],
)
def test_invalid_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=f"ReAnchorConfig.{field}"):
        ReAnchorConfig(**changes)


def test_policy_error_lists_allowed_values():
    with pytest.raises(ValueError, match="'earliest', 'offset', 'random', 'longest_prefix'"):
        ReAnchorConfig(policy="nope")


def test_offsets_are_sorted_and_max_offset():
    cfg = ReAnchorConfig(offsets=(3, 1, 2))
    assert cfg.offsets == (1, 2, 3) and cfg.max_offset == 3
    assert cfg.replace(offsets=()).max_offset == 0
    with pytest.raises(ValueError):
        cfg.replace(node_budget=-1)


def test_store_caps_length_copies_and_releases():
    store = SuffixStore(num_slots=3, max_len=2, feature_dim=4)
    nbytes = store.nbytes
    feats = torch.randn(1, 5, 4)
    store.put(torch.tensor([1]), torch.tensor([10]), torch.tensor([5]), torch.arange(5)[None],
              torch.arange(5)[None] + 1, feats)
    got = store.get(1)
    assert len(got) == 2 and got.tokens.tolist() == [0, 1] and got.predictions.tolist() == [1, 2] and got.start == 10
    assert torch.equal(got.features, feats[0, :2])
    assert got.features.untyped_storage().data_ptr() != feats.untyped_storage().data_ptr()  # a copy
    # a new round replaces the old entry, and a shorter suffix leaves no stale tokens behind
    store.put(torch.tensor([1]), torch.tensor([12]), torch.tensor([1]), torch.tensor([[7]]), torch.tensor([[8]]),
              torch.ones(1, 1, 4))
    assert store.get(1).tokens.tolist() == [7] and store.tokens[1].tolist() == [7, 0]
    assert len(store) == 1 and store.get(0) is None
    batch = store.gather(torch.tensor([1, 0]), torch.tensor([12, 3]))
    assert batch.lengths.tolist() == [1, 0] and batch.features.shape == (2, 2, 4)
    assert store.gather(torch.tensor([1]), torch.tensor([11])).lengths.tolist() == [0]  # starts elsewhere: unused
    store.retain_only(torch.tensor([0, 2]))  # request 1 left the batch: its state is gone
    assert len(store) == 0 and store.get(1) is None
    assert store.nbytes == nbytes  # memory is fixed at construction
    with pytest.raises(ValueError, match="num_slots >= 1"):
        SuffixStore(0, 2, 4)


def test_suffix_shapes_checked():
    with pytest.raises(ValueError, match="RejectedSuffix expects"):
        RejectedSuffix(start=0, tokens=torch.arange(3), predictions=torch.arange(2), features=torch.zeros(3, 4))
    assert len(RejectedSuffix(start=5, tokens=torch.zeros(0, dtype=torch.long),
                              predictions=torch.zeros(0, dtype=torch.long), features=torch.zeros(0, 8))) == 0
