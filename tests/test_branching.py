"""Branch selection (`sglang_reanchor.branching`) against a plain-Python enumeration of every alternative."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sglang_reanchor.branching import branch_candidates
from sglang_reanchor.config import ReAnchorConfig


def draw_slots(data, max_vocab: int, max_block: int):
    """A random baseline block and the drafter's logits at its first ``n`` slots (its drafts their argmax):
    ``(vocab, block, logits [1, n, vocab], probs [1, n, vocab], baseline [block])``."""
    vocab = data.draw(st.integers(3, max_vocab))
    block = data.draw(st.integers(2, max_block))
    n = data.draw(st.integers(1, block - 1))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    logits = torch.randn(1, n, vocab, generator=gen) * 2
    probs = logits.float().softmax(-1)  # what branch_candidates scores
    baseline = [int(torch.randint(vocab, (1,), generator=gen))] + probs[0].argmax(-1).tolist()
    baseline += torch.randint(vocab, (block - 1 - n,), generator=gen).tolist()  # drafts past the logits
    return vocab, block, logits, probs, baseline


def reference_branches(baseline, probs, width, rows, length, threshold):
    """Every (depth, alternative) scored by hand, the best ``rows`` kept, each cut by ``threshold``.

    ``probs[t-1]``: the drafter's distribution at slot t (a list of floats), its argmax the draft g_t.
    Returns ``([(site, tokens)], margin)``, best first, site -1 (and no tokens) for a dropped
    branch; ``margin``: the smallest relative gap between two scores or a score and the threshold
    (where float32 rounding could decide).
    """
    n, block = len(probs), len(baseline)
    q = [p[baseline[t]] for t, p in enumerate(probs, start=1)]  # p_t(g_t)
    scored = []
    for t in range(1, n + 1):
        reach = math.prod(q[: t - 1])
        ranked = sorted(range(len(probs[t - 1])), key=lambda c: -probs[t - 1][c])
        scored += [(reach * probs[t - 1][c], t, c) for c in ranked[1 : 1 + width]]
    scored.sort(key=lambda x: -x[0])
    values = [x[0] for x in scored]
    out = []
    for score, t, c in scored[:rows]:
        tokens = [c] + [baseline[t + k] for k in range(1, block - t)]
        keep = min(length, block - t)
        if threshold is not None:
            kept, running = 0, score
            while kept < keep and t + kept <= n:
                values.append(running)
                if running < threshold:
                    break
                kept += 1
                running *= q[t + kept - 1] if t + kept <= n else 0.0
            if kept == 0:
                out.append((-1, []))
                continue
            keep = kept
        out.append((t, tokens[:keep]))
    ref = sorted(values + ([threshold] if threshold is not None else []))
    margin = min((abs(a - b) / max(a, b, 1e-300) for a, b in zip(ref, ref[1:])), default=1.0)
    return out, margin


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_branches_equal_the_enumeration(data):
    """The chosen branches, their order, sites and kept tokens, with and without a threshold."""
    vocab, block, logits, probs, baseline = draw_slots(data, max_vocab=7, max_block=7)
    width = data.draw(st.integers(1, vocab - 1))
    rows = data.draw(st.integers(1, 6))
    length = data.draw(st.integers(1, block))
    threshold = data.draw(st.one_of(st.none(), st.floats(0.001, 1.0)))
    cfg = ReAnchorConfig(branch_width=width, branch_rows=rows, branch_length=length, verify_threshold=threshold)
    got = branch_candidates(torch.tensor([baseline]), logits, cfg)
    want, margin = reference_branches(baseline, probs[0].tolist(), width, rows, length, threshold)
    assume(margin > 1e-4)  # where float32 rounding decides, either answer is right
    assert len(want) == got.sites.shape[1]
    for m, (site, tokens) in enumerate(want):
        assert int(got.sites[0, m]) == site
        if site > 0:
            assert got.tokens[0, m, : int(got.lengths[0, m])].tolist() == tokens


def test_threshold_drops_unlikely_branches_and_cuts_the_sure_ones_late():
    # slot 1 hesitates (0.5 / 0.4), slot 2 is sure (0.95), slot 3 is not (0.5)
    probs = torch.tensor([[[0.5, 0.4, 0.1], [0.03, 0.95, 0.02], [0.5, 0.3, 0.2]]])
    baseline = torch.tensor([[2, 0, 1, 0]])
    cfg = ReAnchorConfig(branch_width=1, branch_rows=3, branch_length=3)
    plain = branch_candidates(baseline, probs.log(), cfg)
    # scores: (1, 1) 0.4; (2, 0) 0.5 * 0.03; (3, 1) 0.5 * 0.95 * 0.3 = 0.1425
    assert plain.sites.tolist() == [[1, 3, 2]] and plain.lengths.tolist() == [[3, 1, 2]]
    cut = branch_candidates(baseline, probs.log(), cfg.replace(verify_threshold=0.2))
    # the best: 0.4, then * 0.95 = 0.38, then * 0.5 = 0.19 < 0.2 -> 2 tokens; 0.1425 and 0.015 dropped
    assert cut.sites.tolist() == [[1, -1, -1]] and cut.lengths[0, 0].item() == 2
    assert cut.tokens[0, 0, :2].tolist() == [1, 1]


@pytest.mark.parametrize("threshold", [None, 0.05])
def test_branches_over_a_draft_vocabulary_name_target_tokens(threshold):
    token_ids = torch.tensor([40, 10, 30, 20])
    logits = torch.log(torch.tensor([[[0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]]]))
    baseline = torch.tensor([[5, 10, 40]])
    cfg = ReAnchorConfig(branch_width=1, branch_rows=1, branch_length=2, verify_threshold=threshold)
    b = branch_candidates(baseline, logits, cfg, token_ids)
    # the best alternative is slot 1's 2nd choice, column 2 = token 30 (score 0.2), then g_2 = 40 (x 0.7)
    assert b.sites.tolist() == [[1]] and b.tokens[0, 0, :2].tolist() == [30, 40] and b.lengths.tolist() == [[2]]


@pytest.mark.parametrize("shape", ["chains", "best_first"])
@pytest.mark.parametrize("threshold", [None, 0.05])
def test_branch_selection_reads_nothing_from_the_device(threshold, shape):
    """Widths come from the config, never from the drafts: no host sync (`audit.SyncDetector`)."""
    from sglang_reanchor.audit import SyncDetector

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 50, generator=gen)
    baseline = torch.cat([torch.randint(50, (4, 1), generator=gen), logits.argmax(-1),
                          torch.randint(50, (4, 9), generator=gen)], dim=1)  # W = 16, n = 6
    cfg = ReAnchorConfig(branch_width=2, branch_rows=4, branch_length=3, verify_threshold=threshold,
                         branch_shape=shape, node_budget=24)
    with SyncDetector() as syncs:
        branch_candidates(baseline, logits, cfg)
    syncs.assert_none()


def reference_best_first(baseline, probs, width, rows, length, threshold, budget):
    """DDTree's tree by brute force: every path of choices over each slot's top ``1 + width`` tokens
    (choice 0 the draft g_t), the ``budget`` most likely kept, a path at most ``length`` tokens past where
    it leaves the baseline, none below ``threshold``; its leaves off the baseline, best first, as
    ``[(site, tokens)]`` (``rows`` of them, ``(-1, [])`` past the last), and the smallest relative gap
    between two path values or a value and the threshold (where float rounding could decide)."""
    import itertools

    n = len(probs)
    ranked = [sorted(range(len(p)), key=lambda c: -p[c])[: 1 + width] for p in probs]
    nodes = {}  # choices -> (value, site)
    for d in range(1, n + 1):
        for choices in itertools.product(range(1 + width), repeat=d):
            if any(c >= len(ranked[t]) for t, c in enumerate(choices)):
                continue
            off = [t for t, c in enumerate(choices, start=1) if c > 0]
            site = off[0] if off else 0
            if site and d - site >= length:
                continue
            value = math.prod(probs[t][ranked[t][c]] for t, c in enumerate(choices))
            if threshold is not None and value < threshold:
                continue
            nodes[choices] = (value, site)
    best = sorted(nodes, key=lambda c: (-nodes[c][0], len(c)))[:budget]
    chosen = set(best)
    leaves = [c for c in best if nodes[c][1] and not any(c + (x,) in chosen for x in range(1 + width))]
    out = []
    for c in leaves[:rows]:
        site = nodes[c][1]
        out.append((site, [ranked[t][x] if x else baseline[t + 1] for t, x in enumerate(c)][site - 1:]))
    out += [(-1, [])] * (rows - len(out))
    values = sorted([v for v, _ in nodes.values()] + ([threshold] if threshold is not None else []))
    margin = min((abs(a - b) / max(a, b, 1e-300) for a, b in zip(values, values[1:])), default=1.0)
    return out, margin


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_best_first_tree_equals_the_enumeration(data):
    """``branch_shape="best_first"``: the rows are the leaves of the budget's most likely paths, in order."""
    vocab, block, logits, probs, baseline = draw_slots(data, max_vocab=6, max_block=6)
    width = data.draw(st.integers(1, min(3, vocab - 1)))
    rows = data.draw(st.integers(1, 8))
    length = data.draw(st.integers(1, block))
    budget = data.draw(st.integers(1, 24))
    threshold = data.draw(st.one_of(st.none(), st.floats(0.001, 1.0)))
    cfg = ReAnchorConfig(branch_width=width, branch_rows=rows, branch_length=length, verify_threshold=threshold,
                         branch_shape="best_first", node_budget=budget + 1)
    got = branch_candidates(torch.tensor([baseline]), logits, cfg)
    want, margin = reference_best_first(baseline, probs[0].double().tolist(), width, rows, length, threshold,
                                        budget)
    assume(margin > 1e-4)
    assert got.sites.shape == (1, rows) and got.tokens.shape == (1, rows, block)
    assert [(int(s), got.tokens[0, m, : int(got.lengths[0, m])].tolist() if s > 0 else [])
            for m, s in enumerate(got.sites[0])] == want


def test_best_first_takes_a_second_choice_after_a_first():
    """Two hesitant slots: the path that leaves the baseline and then takes slot 2's second choice
    too (0.4 * 0.43) is among the nine most likely, so the tree holds it; chains never leave twice."""
    probs = torch.tensor([[[0.55, 0.4, 0.05], [0.05, 0.52, 0.43], [0.9, 0.06, 0.04]]])
    baseline = torch.tensor([[2, 0, 1, 0]])  # bonus 2, drafts g = 0 1 0 (each slot's argmax)
    cfg = ReAnchorConfig(branch_width=1, branch_rows=4, branch_length=3, node_budget=10, branch_shape="best_first")
    b = branch_candidates(baseline, probs.log(), cfg)
    # by value: g1 .55, [1] .4, g1g2 .286, g1g2g3 .2574, g1 [2] .2365, g1 [2] g3 .21285, [1] g2 .208,
    # [1] g2 g3 .1872, [1 2] .172 (then [1 2] g3 .1548): three leaves off the baseline
    rows = [(int(s), b.tokens[0, m, : int(b.lengths[0, m])].tolist()) for m, s in enumerate(b.sites[0])]
    assert rows == [(2, [2, 0]), (1, [1, 1, 0]), (1, [1, 2]), (-1, [1])]
    chains = branch_candidates(baseline, probs.log(), cfg.replace(branch_shape="chains"))
    for m, s in enumerate(chains.sites[0].tolist()):  # one alternative, then the baseline's drafts
        length = int(chains.lengths[0, m])
        assert chains.tokens[0, m, 1:length].tolist() == baseline[0, 1 + s:s + length].tolist()
