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


def suffix(n, start=10, dim=4):
    return RejectedSuffix(start=start, tokens=torch.arange(n), predictions=torch.arange(n) + 1, features=torch.randn(n, dim))


def test_store_caps_length_copies_and_releases():
    store = SuffixStore(max_len=2, max_requests=2)
    s = suffix(5)
    store.put("a", s)
    got = store.get("a")
    assert len(got) == 2 and got.tokens.tolist() == [0, 1] and got.start == 10
    assert got.features.untyped_storage().data_ptr() != s.features.untyped_storage().data_ptr()
    assert store.nbytes == got.nbytes > 0
    store.put("a", suffix(1))  # a new round replaces the old entry
    assert len(store) == 1 and len(store.get("a")) == 1
    store.put("b", suffix(0))
    with pytest.raises(RuntimeError, match="full"):
        store.put("c", suffix(1))
    store.release("a")
    store.release("a")  # releasing twice is harmless
    store.put("c", suffix(1))
    assert "a" not in store and "c" in store
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_suffix_shapes_checked():
    with pytest.raises(ValueError, match="RejectedSuffix expects"):
        RejectedSuffix(start=0, tokens=torch.arange(3), predictions=torch.arange(2), features=torch.zeros(3, 4))
    assert len(SuffixStore.empty(5, 8)) == 0
