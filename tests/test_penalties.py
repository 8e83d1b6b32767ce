"""Penalties on a draft tree equal plain decoding's penalties for each node's own output."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.penalties import Penalties, history_counts, penalize_tree
from sglang_reanchor.tree import DraftTree


def sequential_penalized(logits: torch.Tensor, output: list[int], freq: float, pres: float, rep: float,
                         min_new: int, stop: set[int]) -> torch.Tensor:
    """SGLang's penalties for the token after ``output`` (one row, ``[V]``), token by token."""
    row = logits.double().clone()
    for v in range(row.shape[0]):
        count = output.count(v)
        row[v] -= freq * count + pres * (count > 0)
        if len(output) < min_new and v in stop:
            row[v] = -float("inf")
        if count:
            row[v] = row[v] * rep if row[v] < 0 else row[v] / rep
    return row


@st.composite
def cases(draw):
    bs = draw(st.integers(1, 3))
    vocab = draw(st.integers(2, 9))
    trees, outputs = [], []
    for _ in range(bs):
        n = draw(st.integers(1, 7))
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
        tokens = [draw(st.integers(0, vocab - 1)) for _ in range(n)]
        trees.append((tokens, parents))
        outputs.append([draw(st.integers(0, vocab - 1)) for _ in range(draw(st.integers(0, 6)))] + [tokens[0]])
    params = [(draw(st.sampled_from([0.0, 0.5, 1.3])), draw(st.sampled_from([0.0, 0.7])),
               draw(st.sampled_from([1.0, 1.25, 0.8])), draw(st.integers(0, 9)),
               set(draw(st.lists(st.integers(0, vocab - 1), max_size=2)))) for _ in range(bs)]
    seed = draw(st.integers(0, 2**31))
    return vocab, trees, outputs, params, seed


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_node_gets_the_penalties_of_its_own_path(case):
    vocab, trees, outputs, params, seed = case
    tree = DraftTree.from_lists([t for t, _ in trees], [p for _, p in trees])
    bs, width = tree.tokens.shape
    logits = torch.randn(bs, width, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    stop = torch.zeros(bs, vocab, dtype=torch.bool)
    for b, p in enumerate(params):
        stop[b, sorted(p[4])] = True
    penalties = Penalties(
        frequency=torch.tensor([p[0] for p in params]), presence=torch.tensor([p[1] for p in params]),
        repetition=torch.tensor([p[2] for p in params]), min_new_tokens=torch.tensor([p[3] for p in params]),
        stop_mask=stop,
    )
    got = penalize_tree(logits, tree, history_counts(outputs, vocab), torch.tensor([len(o) for o in outputs]),
                        penalties)
    for b, (tokens, parents) in enumerate(trees):
        for i in range(len(tokens)):
            path, j = [], i
            while j > 0:  # the root is outputs[b][-1], already in the output
                path.append(tokens[j])
                j = parents[j]
            want = sequential_penalized(logits[b, i], outputs[b] + path[::-1], *params[b])
            torch.testing.assert_close(got[b, i].double(), want, rtol=1e-5, atol=1e-5)


def test_neutral_penalties_change_nothing():
    tree = DraftTree.from_lists([[1, 2, 3, 2]], [[-1, 0, 1, 0]])
    logits = torch.randn(1, 4, 5)
    neutral = Penalties(torch.zeros(1), torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.long),
                        torch.zeros(1, 5, dtype=torch.bool))
    out = penalize_tree(logits, tree, history_counts([[1, 4, 1]], 5), torch.tensor([3]), neutral)
    torch.testing.assert_close(out, logits)


def test_a_shared_penalty_would_change_a_deeper_node():
    """The reason for per-path penalties: node 2's own path repeats token 2, which the history lacks."""
    tree = DraftTree.chain(torch.tensor([[0, 2, 3]]))
    logits = torch.zeros(1, 3, 4)
    logits[0, :, 2] = 1.0  # token 2 is the argmax everywhere without penalties
    pen = Penalties(torch.tensor([2.0]), torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.long),
                    torch.zeros(1, 4, dtype=torch.bool))
    out = penalize_tree(logits, tree, history_counts([[0]], 4), torch.tensor([1]), pen)
    assert out[0, 0].argmax() == 2  # root: nothing repeated yet
    assert out[0, 1, 2] == -1.0 and out[0, 2, 2] == -1.0  # token 2 is on both deeper paths


def test_history_counts():
    counts = history_counts([[1, 1, 3], [], [0]], 4)
    assert counts.tolist() == [[0, 2, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]]
