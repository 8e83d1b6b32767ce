"""Masks, bit packing and plan metadata of `attention` against plain-Python references.

Tiers: exact hand-written cases (incl. the package's doctests), then hypothesis
property tests on random trees against obviously-correct references that walk the
parent pointers one node at a time.
"""

from __future__ import annotations

import doctest
import itertools
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import masks, packing, plan
from attention.masks import (
    ancestor_mask,
    batched_ancestor_mask,
    full_mask,
    multi_anchor_mask,
    padded_ancestor_mask,
    sglang_full_mask,
    sglang_qlen_only_bitpacked,
    sglang_qlen_only_mask,
    tree_depths,
    unpack_full_mask,
)
from attention.packing import pack_rows_to_words, segment_packbits, segment_unpackbits, unpack_words_to_rows
from attention.plan import TreeBatch, plan_tree_batch

# ----------------------------------------------------------------------------
# Obviously-correct references (Python lists, one node at a time)
# ----------------------------------------------------------------------------


def ref_ancestors(parents: list[int]) -> list[set[int]]:
    """ancestors-or-self of every node, by walking up the parent pointers."""
    out = []
    for i in range(len(parents)):
        seen, node = set(), i
        while node != -1:
            seen.add(node)
            node = parents[node]
        out.append(seen)
    return out


def ref_ancestor_matrix(parents: list[int]) -> list[list[bool]]:
    anc = ref_ancestors(parents)
    return [[j in anc[i] for j in range(len(parents))] for i in range(len(parents))]


def ref_full_mask(trees: list[list[int]], prefix_lens: list[int]) -> list[bool]:
    flat: list[bool] = []
    for parents, p in zip(trees, prefix_lens, strict=True):
        for row in ref_ancestor_matrix(parents):
            flat += [True] * p + row
    return flat


def ref_words(trees: list[list[int]]) -> list[int]:
    return [sum(1 << j for j in anc) for parents in trees for anc in ref_ancestors(parents)]


def ref_segment_packbits(bits: list[bool], bounds: list[int]) -> tuple[list[int], list[int]]:
    """numpy.packbits(bitorder="little") per segment; FlashInfer documents the same semantics."""
    packed: list[int] = []
    new_indptr = [0]
    for a, b in itertools.pairwise(bounds):
        seg = np.packbits(np.array(bits[a:b], dtype=np.uint8), bitorder="little").tolist() if b > a else []
        packed += seg
        new_indptr.append(new_indptr[-1] + len(seg))
    return packed, new_indptr


def ref_drafter(context_len: int, extra_len: int, extra_visible: list[int], block_size: int) -> list[list[bool]]:
    num_blocks = len(extra_visible)
    rows = []
    for r in range(num_blocks):
        for _ in range(block_size):
            row = [True] * context_len
            row += [e < extra_visible[r] for e in range(extra_len)]
            row += [c // block_size == r for c in range(num_blocks * block_size)]
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 40) -> list[int]:
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


def as_tensors(tree_lists: list[list[int]]) -> list[torch.Tensor]:
    return [torch.tensor(p, dtype=torch.int64) for p in tree_lists]


PROPERTY = settings(max_examples=60, deadline=None)

# ----------------------------------------------------------------------------
# Exact cases
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("module", [masks, packing, plan], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module, globs={"torch": torch, **vars(module)}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_four_node_example_every_layout() -> None:
    """The example drawn in attention/__init__.py, written out by hand."""
    parents = torch.tensor([-1, 0, 0, 1])
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(ancestor_mask(parents), expected)
    full = sglang_full_mask([parents], [2])
    assert full.tolist() == [
        *[1, 1, 1, 0, 0, 0],
        *[1, 1, 1, 1, 0, 0],
        *[1, 1, 1, 0, 1, 0],
        *[1, 1, 1, 1, 0, 1],
    ]
    assert torch.equal(sglang_qlen_only_mask([parents]), expected.flatten())
    words = sglang_qlen_only_bitpacked([parents])
    assert words.dtype == torch.uint8 and words.tolist() == [0b0001, 0b0011, 0b0101, 0b1011]
    packed, mask_indptr = segment_packbits(full, torch.tensor([0, 24]))
    assert packed.tolist() == [199, 115, 189] and mask_indptr.tolist() == [0, 3]


def test_chain_is_causal_and_star_is_root_plus_self() -> None:
    n = 7
    chain = torch.arange(-1, n - 1)
    assert torch.equal(ancestor_mask(chain), torch.ones(n, n, dtype=torch.bool).tril())
    star = torch.tensor([-1] + [0] * (n - 1))
    expected = torch.eye(n, dtype=torch.bool)
    expected[:, 0] = True
    assert torch.equal(ancestor_mask(star), expected)
    assert tree_depths([chain, star]).tolist() == list(range(n)) + [0] + [1] * (n - 1)


def test_deep_chain_needs_many_jumps() -> None:
    n = 300  # depth 299: 9 pointer-jumping steps
    assert torch.equal(ancestor_mask(torch.arange(-1, n - 1)), torch.ones(n, n, dtype=torch.bool).tril())


def test_single_node_tree() -> None:
    assert ancestor_mask(torch.tensor([-1])).tolist() == [[True]]
    assert sglang_full_mask([torch.tensor([-1])], [0]).tolist() == [True]
    assert sglang_full_mask([torch.tensor([-1])], [3]).tolist() == [True] * 4


def test_bitpacked_word_dtype_follows_tree_size() -> None:
    for n, dtype in [(1, torch.uint8), (8, torch.uint8), (9, torch.uint16), (16, torch.uint16), (17, torch.uint32)]:
        assert sglang_qlen_only_bitpacked([torch.arange(-1, n - 1)]).dtype == dtype
    chain32 = sglang_qlen_only_bitpacked([torch.arange(-1, 31)])
    assert chain32.dtype == torch.uint32 and int(chain32[-1].to(torch.int64)) == 2**32 - 1


def test_drafter_mask_hand_case() -> None:
    got = multi_anchor_mask(1, torch.tensor([[2, 0, 1]]), 2, 1)[0]
    assert got.int().tolist() == [[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1]]
    assert multi_anchor_mask(3, torch.zeros(1, 0, dtype=torch.int64), 0, 4).shape == (1, 0, 3)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.tensor([0, 0]), "parents"),
        (torch.tensor([-1, 1]), "parents"),
        (torch.tensor([-1, 0, 3, 1]), "parents"),
        (torch.tensor([-1, -1]), "parents"),
        (torch.tensor([-1.0, 0.0]), "int64"),
        (torch.tensor([[-1, 0]]), "1-D"),
        (torch.zeros(0, dtype=torch.int64), "root"),
    ],
)
def test_invalid_parents_raise(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ancestor_mask(bad)


def test_invalid_arguments_raise() -> None:
    tree = torch.tensor([-1, 0])
    with pytest.raises(ValueError, match="prefix_lens"):
        sglang_full_mask([tree, tree], [1])
    with pytest.raises(ValueError, match="prefix_lens"):
        sglang_full_mask([tree], [-1])
    with pytest.raises(ValueError, match="32"):
        sglang_qlen_only_bitpacked([torch.arange(-1, 32)])
    with pytest.raises(ValueError, match="extra_visible"):
        multi_anchor_mask(2, torch.tensor([4]), 3, 2)  # [R], not [bs, R]
    with pytest.raises(ValueError, match="extra_visible"):
        multi_anchor_mask(2, torch.tensor([[1.0]]), 3, 2)
    with pytest.raises(ValueError, match="block_size"):
        multi_anchor_mask(2, torch.tensor([[1]]), 3, 0)
    with pytest.raises(ValueError, match="indptr"):
        segment_packbits(torch.ones(5, dtype=torch.bool), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="kv_indices"):
        TreeBatch.from_lists([[-1, 0]], [3], kv_indices=[[0, 1, 2]])


# ----------------------------------------------------------------------------
# Property tests on random trees
# ----------------------------------------------------------------------------


@PROPERTY
@given(tree=trees())
def test_ancestor_mask_matches_walk(tree: list[int]) -> None:
    got = ancestor_mask(torch.tensor(tree))
    assert got.dtype == torch.bool and got.tolist() == ref_ancestor_matrix(tree)


@PROPERTY
@given(batch=st.lists(trees(max_nodes=20), min_size=1, max_size=5))
def test_batched_ancestor_mask_and_depths(batch: list[list[int]]) -> None:
    got, num_nodes = batched_ancestor_mask(as_tensors(batch))
    n_max = max(len(t) for t in batch)
    assert got.shape == (len(batch), n_max, n_max) and num_nodes.tolist() == [len(t) for t in batch]
    for b, tree in enumerate(batch):
        n = len(tree)
        assert got[b, :n, :n].tolist() == ref_ancestor_matrix(tree)
        assert not got[b, n:].any() and not got[b, :, n:].any()
    depths = [len(a) - 1 for t in batch for a in ref_ancestors(t)]
    assert tree_depths(as_tensors(batch)).tolist() == depths


@PROPERTY
@given(data=st.data(), batch=st.lists(trees(max_nodes=16), min_size=1, max_size=4))
def test_sglang_layouts_match_reference(data: st.DataObject, batch: list[list[int]]) -> None:
    prefix_lens = data.draw(st.lists(st.integers(0, 12), min_size=len(batch), max_size=len(batch)))
    full = sglang_full_mask(as_tensors(batch), torch.tensor(prefix_lens))
    assert full.dtype == torch.bool and full.tolist() == ref_full_mask(batch, prefix_lens)
    qlen = sglang_qlen_only_mask(as_tensors(batch))
    assert qlen.tolist() == ref_full_mask(batch, [0] * len(batch))
    words = sglang_qlen_only_bitpacked(as_tensors(batch))
    assert words.dtype == packing.sglang_word_dtype(max(len(t) for t in batch))
    assert words.to(torch.int64).tolist() == ref_words(batch)


@PROPERTY
@given(tree=trees(max_nodes=32))
def test_words_unpack_to_ancestor_rows(tree: list[int]) -> None:
    words = sglang_qlen_only_bitpacked([torch.tensor(tree)])
    assert unpack_words_to_rows(words, len(tree)).tolist() == ref_ancestor_matrix(tree)


@PROPERTY
@given(segments=st.lists(st.lists(st.booleans(), max_size=40), min_size=1, max_size=6))
def test_segment_packbits_matches_numpy_little(segments: list[list[bool]]) -> None:
    bits = [b for seg in segments for b in seg]
    bounds = np.cumsum([0] + [len(s) for s in segments]).tolist()
    packed, new_indptr = segment_packbits(torch.tensor(bits, dtype=torch.bool), torch.tensor(bounds))
    want_packed, want_indptr = ref_segment_packbits(bits, bounds)
    assert packed.dtype == torch.uint8 and new_indptr.dtype == torch.int32
    assert packed.tolist() == want_packed and new_indptr.tolist() == want_indptr
    assert segment_unpackbits(packed, new_indptr, [len(s) for s in segments]).tolist() == bits


@PROPERTY
@given(rows=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=6))
def test_pack_rows_to_words_bit_j_is_column_j(rows: list[list[bool]]) -> None:
    words = pack_rows_to_words(torch.tensor(rows))
    assert words.tolist() == [sum(1 << j for j, b in enumerate(r) if b) for r in rows]


@PROPERTY
@given(data=st.data())
def test_drafter_mask_matches_reference(data: st.DataObject) -> None:
    context_len = data.draw(st.integers(0, 6))
    extra_len = data.draw(st.integers(0, 6))
    block_size = data.draw(st.integers(1, 4))
    visible = data.draw(st.lists(st.integers(0, extra_len), min_size=0, max_size=4))
    rows = data.draw(st.integers(1, 3))
    visible = torch.tensor([visible] * rows, dtype=torch.int64).reshape(rows, len(visible))
    got = multi_anchor_mask(context_len, visible, extra_len, block_size)
    num_blocks = visible.shape[1]
    assert got.shape == (rows, num_blocks * block_size, context_len + extra_len + num_blocks * block_size)
    for b in range(rows):
        assert got[b].tolist() == ref_drafter(context_len, extra_len, visible[b].tolist(), block_size)


@PROPERTY
@given(batch=st.lists(trees(max_nodes=10), min_size=1, max_size=4), data=st.data())
def test_padded_ancestor_mask_is_each_trees_mask_padding_sees_itself(batch: list[list[int]],
                                                                     data: st.DataObject) -> None:
    """The core's padded trees (-1 padding) get each tree's ancestor mask; padding nodes see themselves."""
    n = max(len(t) for t in batch) + data.draw(st.integers(0, 2))
    parents = torch.full((len(batch), n), -1, dtype=torch.int64)
    for b, t in enumerate(batch):
        parents[b, : len(t)] = torch.tensor(t)
    got = padded_ancestor_mask(parents)
    for b, t in enumerate(batch):
        want = torch.eye(n, dtype=torch.bool)
        want[: len(t), : len(t)] = ancestor_mask(torch.tensor(t))
        assert torch.equal(got[b], want), (t, n)


@PROPERTY
@given(data=st.data())
def test_full_mask_is_each_requests_rows_behind_its_prefix(data: st.DataObject) -> None:
    bs, q, k = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5)), data.draw(st.integers(0, 5))
    tail = torch.tensor(data.draw(st.lists(st.booleans(), min_size=bs * q * k, max_size=bs * q * k))).view(bs, q, k)
    prefix = torch.tensor(data.draw(st.lists(st.integers(0, 6), min_size=bs, max_size=bs)))
    ragged = data.draw(st.booleans())
    rows = torch.tensor([data.draw(st.integers(0, q)) for _ in range(bs)]) if ragged else None
    cols = torch.tensor([data.draw(st.integers(0, k)) for _ in range(bs)]) if ragged else None
    pieces = []
    for b in range(bs):
        r = q if rows is None else int(rows[b])
        c = k if cols is None else int(cols[b])
        block = torch.ones(r, int(prefix[b]) + c, dtype=torch.bool)
        block[:, int(prefix[b]):] = tail[b, :r, :c]
        pieces.append(block.flatten())
    assert torch.equal(full_mask(tail, prefix, rows, cols), torch.cat(pieces))


@PROPERTY
@given(data=st.data(), batch=st.lists(trees(max_nodes=12), min_size=1, max_size=4))
def test_plan_matches_flashinfer_page_size_one_contract(data: st.DataObject, batch: list[list[int]]) -> None:
    prefix_lens = data.draw(st.lists(st.integers(0, 10), min_size=len(batch), max_size=len(batch)))
    total_slots = sum(prefix_lens) + sum(len(t) for t in batch)
    perm = data.draw(st.permutations(list(range(total_slots + 5))))[:total_slots]
    slots, cursor = [], 0
    for t, p in zip(batch, prefix_lens, strict=True):
        slots.append(perm[cursor : cursor + p + len(t)])
        cursor += p + len(t)
    tp = plan_tree_batch(TreeBatch.from_lists(batch, prefix_lens, slots))

    n = [len(t) for t in batch]
    kv = [p + len(t) for t, p in zip(batch, prefix_lens, strict=True)]
    assert tp.qo_indptr.tolist() == np.cumsum([0, *n]).tolist()
    assert tp.kv_indptr.tolist() == np.cumsum([0, *kv]).tolist()
    assert tp.kv_indices.tolist() == [s for req in slots for s in req]
    for index_tensor in (tp.qo_indptr, tp.kv_indptr, tp.kv_indices, tp.kv_last_page_len, tp.mask_indptr):
        assert index_tensor.dtype == torch.int32
    # FlashInfer's kv length for page size 1: (num_pages - 1) * 1 + last_page_len.
    pages = (tp.kv_indptr[1:] - tp.kv_indptr[:-1]).tolist()
    assert [(pg - 1) + last for pg, last in zip(pages, tp.kv_last_page_len.tolist(), strict=True)] == kv
    want_mask = ref_full_mask(batch, prefix_lens)
    assert tp.custom_mask.tolist() == want_mask
    bounds = np.cumsum([0] + [a * b for a, b in zip(n, kv, strict=True)]).tolist()
    want_packed, want_indptr = ref_segment_packbits(want_mask, bounds)
    assert tp.packed_custom_mask.tolist() == want_packed and tp.mask_indptr.tolist() == want_indptr
    depths = [len(a) - 1 for t in batch for a in ref_ancestors(t)]
    offsets = [p for t, p in zip(batch, prefix_lens, strict=True) for _ in t]
    assert tp.positions.tolist() == [p + d for p, d in zip(offsets, depths, strict=True)]


def test_segment_packbits_matches_flashinfer() -> None:
    """Compares with FlashInfer's own packer (needs flashinfer and CUDA; skipped otherwise)."""
    flashinfer = pytest.importorskip("flashinfer")
    if not torch.cuda.is_available():
        pytest.skip("flashinfer's segment_packbits is a CUDA kernel")
    gen = torch.Generator().manual_seed(0)
    lens = [0, 1, 7, 8, 9, 100, 333]
    bits = torch.rand(sum(lens), generator=gen) < 0.5
    indptr = torch.tensor(np.cumsum([0, *lens]).tolist(), dtype=torch.int32)
    fi_packed, fi_indptr = flashinfer.segment_packbits(bits.cuda(), indptr.cuda(), bitorder="little")
    packed, new_indptr = segment_packbits(bits, indptr)
    assert packed.tolist() == fi_packed.cpu().tolist()
    assert new_indptr.tolist() == fi_indptr.cpu().tolist()


@settings(max_examples=60, deadline=None)
@given(prefixes=st.lists(st.integers(0, 9), min_size=1, max_size=5), q=st.integers(1, 6),
       extra=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_unpack_full_mask_inverts_full_mask(prefixes, q, extra, seed):
    """Each request's padded rows: its prefix columns, False padding up to ``max_prefix``, its own tail."""
    gen = torch.Generator().manual_seed(seed)
    tails = torch.rand(len(prefixes), q, q, generator=gen) < 0.5
    p = torch.tensor(prefixes)
    max_prefix = max(prefixes) + extra
    flat = full_mask(tails, p)
    padded = unpack_full_mask(flat.to(torch.uint8), p, q, max_prefix)
    assert padded.shape == (len(prefixes), q, max_prefix + q) and padded.dtype == torch.bool
    for b, s in enumerate(prefixes):
        assert padded[b, :, :s].all() and not padded[b, :, s:max_prefix].any()
        assert torch.equal(padded[b, :, max_prefix:], tails[b])
    with pytest.raises(ValueError, match="FULL_MASK"):
        unpack_full_mask(flat[:-1], p, q, max_prefix)
