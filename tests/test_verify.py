"""Tree acceptance (greedy and sampling) and the rejected suffix, against a Python walk."""

from __future__ import annotations

import math
from collections import Counter

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.sampling import SamplingParams, sample_tokens, target_probs
from sglang_reanchor.tree import DraftTree
from sglang_reanchor.verify import accept_tree, verify_tree


@st.composite
def trie_and_picks(draw):
    """A random trie (distinct sibling tokens) and a target pick per node."""
    vocab = draw(st.integers(2, 4))
    n = draw(st.integers(1, 24))
    tokens, parents = [draw(st.integers(0, vocab - 1))], [-1]
    used = {}
    for _ in range(1, n):
        p = draw(st.integers(0, len(tokens) - 1))
        free = [t for t in range(vocab) if (p, t) not in used]
        if not free:
            continue
        t = draw(st.sampled_from(free))
        used[(p, t)] = len(tokens)
        tokens.append(t)
        parents.append(p)
    picks = draw(st.lists(st.integers(0, vocab - 1), min_size=len(tokens), max_size=len(tokens)))
    top1 = draw(st.lists(st.integers(0, vocab - 1), min_size=len(tokens), max_size=len(tokens)))
    return tokens, parents, picks, top1


def oracle_accept(tokens, parents, picks):
    """Walk from the root to the child holding the pick; return path and bonus."""
    path = [0]
    while True:
        kids = [c for c in range(len(tokens)) if parents[c] == path[-1] and tokens[c] == picks[path[-1]]]
        if not kids:
            return path, picks[path[-1]]
        path.append(kids[0])


def oracle_suffix(tokens, parents, last):
    depth = [0] * len(tokens)
    for i in range(1, len(tokens)):
        depth[i] = depth[parents[i]] + 1

    def height(i):
        kids = [c for c in range(len(tokens)) if parents[c] == i]
        return 0 if not kids else 1 + max(height(c) for c in kids)

    out, cur = [], last
    while True:
        kids = [c for c in range(len(tokens)) if parents[c] == cur]
        if not kids:
            return out
        cur = max(kids, key=lambda c: (height(c), -c))
        out.append(cur)


@settings(max_examples=300, deadline=None)
@given(st.lists(trie_and_picks(), min_size=1, max_size=3))
def test_accept_matches_walk(batch):
    tree = DraftTree.from_lists([b[0] for b in batch], [b[1] for b in batch])
    n = tree.width
    pad = lambda xs: xs + [0] * (n - len(xs))
    picks = torch.tensor([pad(b[2]) for b in batch])
    top1 = torch.tensor([pad(b[3]) for b in batch])
    acc = accept_tree(tree, picks, top1)
    for i, (tokens, parents, pk, t1) in enumerate(batch):
        path, bonus = oracle_accept(tokens, parents, pk)
        assert acc.accept_lengths[i] == len(path)
        assert acc.accepted_nodes[i, : len(path)].tolist() == path
        assert (acc.accepted_nodes[i, len(path):] == -1).all()
        assert acc.bonus[i] == bonus
        assert acc.new_tokens(tree)[i] == [tokens[j] for j in path[1:]] + [bonus]
        suffix = oracle_suffix(tokens, parents, path[-1])
        assert acc.suffix_lengths[i] == len(suffix)
        assert acc.suffix_nodes[i, : len(suffix)].tolist() == suffix
        assert acc.suffix_tokens[i, : len(suffix)].tolist() == [tokens[j] for j in suffix]
        assert acc.suffix_predictions[i, : len(suffix)].tolist() == [t1[j] for j in suffix]


def test_chain_cases():
    chain = DraftTree.chain(torch.tensor([[1, 2, 3, 4]]))
    full = accept_tree(chain, torch.tensor([[2, 3, 4, 9]]), torch.tensor([[2, 3, 4, 9]]))
    assert full.accept_lengths.tolist() == [4] and full.bonus.tolist() == [9] and full.suffix_lengths.tolist() == [0]
    first = accept_tree(chain, torch.tensor([[7, 3, 4, 5]]), torch.tensor([[7, 3, 4, 5]]))
    # rejected at depth 1: the suffix is every chain node after the root, predictions are top-1 there
    assert first.accept_lengths.tolist() == [1] and first.bonus.tolist() == [7]
    assert first.suffix_nodes.tolist() == [[1, 2, 3]] and first.suffix_predictions.tolist() == [[3, 4, 5]]
    # host widths: the path and the suffix have exactly the columns asked for
    short = accept_tree(chain, torch.tensor([[7, 3, 4, 5]]), torch.tensor([[7, 3, 4, 5]]), path_width=2, suffix_width=2)
    assert short.accepted_nodes.tolist() == [[0, -1]] and short.suffix_nodes.tolist() == [[1, 2]]
    assert short.suffix_lengths.tolist() == [2]  # cut to the width, as the suffix store keeps it


def test_suffix_tie_prefers_lowest_id():
    # root has two rejected children of equal height: node 1 (baseline) wins
    tree = DraftTree.from_lists([[0, 1, 2, 3, 4]], [[-1, 0, 0, 1, 2]])
    acc = accept_tree(tree, torch.tensor([[9, 0, 0, 0, 0]]), torch.zeros(1, 5, dtype=torch.long))
    assert acc.suffix_nodes.tolist() == [[1, 3, -1, -1]] and acc.suffix_lengths.tolist() == [2]


def test_sampling_acceptance_reproduces_target_distribution():
    """Emitted (token1, token2) frequencies under tree acceptance equal the exact target joint."""
    torch.manual_seed(0)
    vocab = 3
    # root 0; children tokens 0 and 1 (nodes 1, 2); node 1 has child token 2 (node 3)
    logits = torch.randn(1, 4, vocab)
    params = SamplingParams(temperature=0.8)
    probs = target_probs(logits, params)[0]  # [N, V]
    trials = 20000
    gen = torch.Generator().manual_seed(1)
    counts = Counter()
    for _ in range(trials // 500):
        # 500 independent rounds at once: a batch of copies of the tree
        batch = DraftTree.from_lists([[0, 0, 1, 2]] * 500, [[-1, 0, 0, 1]] * 500)
        acc = verify_tree(batch, logits.expand(500, -1, -1), params, gen)
        for toks in acc.new_tokens(batch):
            counts[tuple(toks[:2])] += 1 if len(toks) >= 2 else 0
            if len(toks) == 1:
                counts[(toks[0], None)] += 1
    # exact: first token t ~ p(root); if t has a child node c, the second token ~ p(c)
    child = {0: 1, 1: 2}
    for t in range(vocab):
        for u in range(vocab):
            if t not in child:
                continue
            exact = float(probs[0, t] * probs[child[t], u])
            freq = counts[(t, u)] / trials
            assert abs(freq - exact) < 4 * math.sqrt(exact * (1 - exact) / trials) + 1e-3, (t, u, freq, exact)
    assert abs(counts[(2, None)] / trials - float(probs[0, 2])) < 0.015


def test_sampling_params_validation_and_filters():
    import pytest

    for bad in (dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=True)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # the top token alone already holds > 0.5
    assert sample_tokens(logits, SamplingParams()).tolist() == [0]
