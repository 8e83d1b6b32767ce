"""Draft-tree construction and compilation against a plain-Python trie oracle."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.config import ReAnchorConfig
from sglang_reanchor.round import RoundCore
from sglang_reanchor.tree import DraftTree, build_draft_tree

# ---- oracle ------------------------------------------------------------------------


def oracle_sites(baseline, row, d, rejected, cfg):
    """Attachment depth of one row under cfg (None = skipped); 'random' is not modelled."""
    block = len(baseline)
    lo = 0 if cfg.root_site else 1
    matches = [j for j in range(lo, block) if baseline[j] == row[0]]
    if cfg.policy == "offset":
        return d if d <= block else None
    if matches:
        if cfg.policy == "earliest":
            return matches[0]
        if cfg.policy == "longest_prefix":

            def agree(j):
                n = 0
                while j - 1 - n >= 0 and d - 1 - n >= 0 and d - 1 - n < len(rejected) and baseline[j - 1 - n] == rejected[d - 1 - n]:
                    n += 1
                return n

            return max(matches, key=lambda j: (agree(j), -j))
    if cfg.fallback == "offset" and d <= block:
        return d
    return None


def oracle_tree(baseline, rows, offsets, rejected, cfg, base_cut=None, row_cuts=None):
    """Insert baseline then rows into a dict trie, in creation order; apply region, depth cap
    and budget (and ``base_cut`` / ``row_cuts``: drafts kept of the baseline and of each row)."""
    block = len(baseline)
    tokens, parents, depth = [baseline[0]], [-1], [0]
    child = {}

    def insert(parent, tok):
        key = (parent, tok)
        if key not in child:
            child[key] = len(tokens)
            tokens.append(tok)
            parents.append(parent)
            depth.append(depth[parent] + 1)
        return child[key]

    cap = block + len(baseline) if cfg.max_depth is None else cfg.max_depth
    base_nodes = [0]
    for tok in baseline[1:] if base_cut is None else baseline[1 : 1 + base_cut]:
        if len(base_nodes) > cap:  # the next baseline node would sit at depth len(base_nodes)
            break
        base_nodes.append(insert(base_nodes[-1], tok))
    sites = []
    for r, (row, d) in enumerate(zip(rows, offsets)):
        site = oracle_sites(baseline, row, d, rejected, cfg)
        if site is not None and base_cut is not None and site - 1 > base_cut:
            site = None  # it would hang below a baseline draft that was cut
        sites.append(site)
        if site is None:
            continue
        for k, tok in enumerate(row if row_cuts is None else row[: 1 + row_cuts[r]]):
            dep = site + k
            if dep > cap:
                break
            if cfg.region == "in_block" and dep > block - 1:
                break
            if cfg.region == "beyond" and dep <= block - 1 and baseline[dep] != tok:
                break
            if k == 0:
                cur = 0 if site == 0 else insert(base_nodes[site - 1], tok)
            else:
                cur = insert(cur, tok)
    n = min(len(tokens), cfg.node_budget)
    return tokens[:n], parents[:n], depth[:n], sites


def tree_lists(tree: DraftTree, b: int = 0):
    n = int(tree.num_nodes[b])
    return tree.tokens[b, :n].tolist(), tree.parents[b, :n].tolist(), tree.depth[b, :n].tolist()


@st.composite
def tree_inputs(draw):
    block = draw(st.integers(2, 8))
    vocab = draw(st.integers(2, 5))  # tiny vocab: many matches and merges
    offsets = sorted(draw(st.sets(st.integers(1, block + 1), max_size=4)))
    rows = len(offsets)
    bs = draw(st.integers(1, 3))
    tok = st.integers(0, vocab - 1)
    baseline = [draw(st.lists(tok, min_size=block, max_size=block)) for _ in range(bs)]
    shifted = [[draw(st.lists(tok, min_size=block, max_size=block)) for _ in range(rows)] for _ in range(bs)]
    rejected = [draw(st.lists(tok, min_size=block + 1, max_size=block + 1)) for _ in range(bs)]
    valid = [[draw(st.booleans()) for _ in range(rows)] for _ in range(bs)]
    cfg = ReAnchorConfig(
        offsets=tuple(offsets) or (1,),
        policy=draw(st.sampled_from(["earliest", "offset", "longest_prefix"])),
        root_site=draw(st.booleans()),
        fallback=draw(st.sampled_from(["skip", "offset"])),
        node_budget=draw(st.integers(1, 4 * block)),
        region=draw(st.sampled_from(["all", "in_block", "beyond"])),
        max_depth=draw(st.one_of(st.none(), st.integers(1, 2 * block))),
    )
    return baseline, shifted, offsets, valid, rejected, cfg


def build(baseline, shifted, offsets, valid, rejected, cfg, generator=None, row_drafts=None):
    bs, block = len(baseline), len(baseline[0])
    rows = len(offsets)
    return build_draft_tree(
        torch.tensor(baseline),
        torch.tensor(shifted, dtype=torch.long).reshape(bs, rows, block),
        offsets=torch.tensor(offsets, dtype=torch.long),
        row_valid=torch.tensor(valid, dtype=torch.bool).reshape(bs, rows),
        rejected_tokens=torch.tensor(rejected),
        config=cfg,
        generator=generator,
        row_drafts=None if row_drafts is None else torch.tensor(row_drafts, dtype=torch.long).reshape(bs, 1 + rows),
    )


# ---- construction --------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(tree_inputs())
def test_build_matches_trie_oracle(inputs):
    baseline, shifted, offsets, valid, rejected, cfg = inputs
    tree = build(*inputs)
    for b in range(len(baseline)):
        rows = [r for r, v in zip(shifted[b], valid[b]) if v]
        offs = [d for d, v in zip(offsets, valid[b]) if v]
        tokens, parents, depth, sites = oracle_tree(baseline[b], rows, offs, rejected[b], cfg)
        assert tree_lists(tree, b) == (tokens, parents, depth)
        got_sites = [s for s, v in zip(tree.row_sites[b].tolist(), valid[b]) if v]
        for got, want in zip(got_sites, sites):
            assert got == -1 if want is None else got in (want, -1)  # -1: anchor cut by region/budget


@settings(max_examples=300, deadline=None)
@given(tree_inputs(), st.data())
def test_cut_rows_match_the_trie_oracle(inputs, data):
    """``row_drafts`` (what ``verify_threshold`` keeps): the baseline's first drafts, each row's
    anchor and first drafts; a row below a cut baseline draft is not attached."""
    baseline, shifted, offsets, valid, rejected, cfg = inputs
    block = len(baseline[0])
    cuts = [[data.draw(st.integers(1, block - 1)) if block > 1 else 1]
            + [data.draw(st.integers(0, block - 1)) for _ in offsets] for _ in baseline]
    tree = build(*inputs, row_drafts=cuts)
    for b in range(len(baseline)):
        keep = [r for r, v in enumerate(valid[b]) if v]
        tokens, parents, depth, sites = oracle_tree(
            baseline[b], [shifted[b][r] for r in keep], [offsets[r] for r in keep], rejected[b], cfg,
            base_cut=cuts[b][0], row_cuts=[cuts[b][1 + r] for r in keep])
        assert tree_lists(tree, b) == (tokens, parents, depth)
        got_sites = [tree.row_sites[b, r].item() for r in keep]
        for got, want in zip(got_sites, sites):
            assert got == -1 if want is None else got in (want, -1)
    full = [[block - 1] + [block - 1] * len(offsets) for _ in baseline]  # nothing cut: the same tree
    uncut, cut_nothing = build(*inputs), build(*inputs, row_drafts=full)
    assert all(torch.equal(getattr(uncut, f), getattr(cut_nothing, f)) for f in DraftTree.__dataclass_fields__)


@settings(max_examples=200, deadline=None)
@given(tree_inputs())
def test_tree_invariants(inputs):
    baseline, shifted, offsets, valid, rejected, cfg = inputs
    tree = build(*inputs)
    anc = tree.ancestor_mask()
    index, next_token, next_sibling = tree.retrieve_arrays()
    prefix = torch.randint(0, 50, (tree.batch_size,))
    pos = tree.positions(prefix)
    for b in range(tree.batch_size):
        tokens, parents, depth = tree_lists(tree, b)
        n = len(tokens)
        assert 1 <= n <= cfg.node_budget
        assert tokens[0] == baseline[b][0] and parents[0] == -1
        # parents precede children; depth is parent depth + 1; positions are depths
        for i in range(1, n):
            assert 0 <= parents[i] < i and depth[i] == depth[parents[i]] + 1
        assert pos[b, :n].tolist() == [int(prefix[b]) + d for d in depth]
        # a trie: no two children of one node share a token
        kids = {}
        for i in range(1, n):
            assert (parents[i], tokens[i]) not in kids
            kids[(parents[i], tokens[i])] = i
        # the mask is exactly "j is i or an ancestor of i"
        for i in range(n):
            chain, j = {i}, i
            while parents[j] >= 0:
                j = parents[j]
                chain.add(j)
            assert {j for j in range(n) if anc[b, i, j]} == chain
        # pointer arrays agree with parents
        children = {i: [c for c in range(1, n) if parents[c] == i] for i in range(n)}
        for i in range(n):
            assert index[b, i] == b * tree.width + i
            assert next_token[b, i] == (children[i][0] if children[i] else -1)
            sibs = children[parents[i]] if i > 0 else [i]
            later = [c for c in sibs if c > i]
            assert next_sibling[b, i] == (later[0] if later else -1)
        assert (index[b, n:] == -1).all() and (next_token[b, n:] == -1).all()


def test_random_policy_picks_a_matching_site_and_is_seeded():
    rng = random.Random(0)
    for trial in range(50):
        block, vocab = 8, 3
        baseline = [[rng.randrange(vocab) for _ in range(block)]]
        shifted = [[[rng.randrange(vocab) for _ in range(block)] for _ in range(3)]]
        cfg = ReAnchorConfig(offsets=(1, 2, 3), policy="random", node_budget=64)
        args = (baseline, shifted, [1, 2, 3], [[True] * 3], [[0] * 4], cfg)
        t1 = build(*args, generator=torch.Generator().manual_seed(trial))
        t2 = build(*args, generator=torch.Generator().manual_seed(trial))
        assert torch.equal(t1.tokens, t2.tokens) and torch.equal(t1.row_sites, t2.row_sites)
        for r, site in enumerate(t1.row_sites[0].tolist()):
            matches = [j for j in range(1, block) if baseline[0][j] == shifted[0][r][0]]
            assert (site in matches) if matches else site == -1


def test_random_policy_covers_every_match():
    baseline = [[5, 1, 2, 1, 3, 1]]  # anchor 1 matches depths 1, 3, 5
    shifted = [[[1, 4, 4, 4, 4, 4]]]
    cfg = ReAnchorConfig(offsets=(2,), policy="random")
    gen = torch.Generator().manual_seed(0)
    seen = {int(build(baseline, shifted, [2], [[True]], [[0, 0]], cfg, gen).row_sites[0, 0]) for _ in range(60)}
    assert seen == {1, 3, 5}


# ---- exact cases --------------------------------------------------------------------


def test_policies_on_a_hand_made_case():
    # baseline b=9: 9 1 2 1 2; shifted row d=2 anchored at 1; rejected tokens r = [7, 2]
    baseline = [[9, 1, 2, 1, 2]]
    shifted = [[[1, 5, 6, 7, 8]]]
    rej = [[7, 2, 0]]

    def site(**kw):
        cfg = ReAnchorConfig(offsets=(2,), node_budget=64, **kw)
        return int(build(baseline, shifted, [2], [[True]], rej, cfg).row_sites[0, 0])

    assert site(policy="earliest") == 1
    assert site(policy="offset") == 2
    # before a_d come r = [7, 2]; at depth 3 the baseline before it is [.., 1, 2] -> 1 token agrees
    assert site(policy="longest_prefix") == 3


def test_root_site_merges_into_root():
    cfg = ReAnchorConfig(offsets=(1,), root_site=True)
    tree = build([[4, 5, 6]], [[[4, 5, 7]]], [1], [[True]], [[0, 0]], cfg)
    assert tree_lists(tree) == ([4, 5, 6, 7], [-1, 0, 1, 1], [0, 1, 2, 2])
    assert tree.row_sites.tolist() == [[0]]


def test_no_match_skip_vs_offset_fallback():
    args = ([[1, 2, 3]], [[[9, 8, 7]]], [2], [[True]], [[0, 0]])
    skip = build(*args, ReAnchorConfig(offsets=(2,), fallback="skip"))
    assert tree_lists(skip) == ([1, 2, 3], [-1, 0, 1], [0, 1, 2]) and skip.row_sites.tolist() == [[-1]]
    off = build(*args, ReAnchorConfig(offsets=(2,), fallback="offset"))
    assert tree_lists(off) == ([1, 2, 3, 9, 8, 7], [-1, 0, 1, 1, 3, 4], [0, 1, 2, 2, 3, 4])


def test_budget_drops_deepest_nodes_of_last_rows_first():
    cfg = ReAnchorConfig(offsets=(1, 2), node_budget=6)
    tree = build([[0, 1, 2]], [[[1, 5, 6], [2, 7, 8]]], [1, 2], [[True, True]], [[0, 0, 0]], cfg)
    # baseline 0-1-2 (3 nodes), row d=1: 1(merged)-5-6 (2 new), row d=2: 2(merged)-7-8 -> only 7 fits
    assert tree_lists(tree) == ([0, 1, 2, 5, 6, 7], [-1, 0, 1, 1, 3, 2], [0, 1, 2, 2, 3, 3])


def test_chain_and_from_lists():
    chain = DraftTree.chain(torch.tensor([[4, 5, 6]]))
    assert tree_lists(chain) == ([4, 5, 6], [-1, 0, 1], [0, 1, 2])
    cut = DraftTree.chain(torch.tensor([[4, 5, 6, 7], [1, 2, 3, 4]]), torch.tensor([2, 4]))
    assert tree_lists(cut, 0) == ([4, 5], [-1, 0], [0, 1]) and tree_lists(cut, 1) == ([1, 2, 3, 4], [-1, 0, 1, 2], [0, 1, 2, 3])
    padding = DraftTree.from_lists([[4, 5], [1, 2, 3, 4]], [[-1, 0], [-1, 0, 1, 2]])
    assert torch.equal(cut.ancestors, padding.ancestors) and torch.equal(cut.parents, padding.parents)
    assert torch.equal(cut.trimmed().tokens, cut.tokens)  # the widest chain keeps every column
    with pytest.raises(ValueError, match="parent of node 2"):
        DraftTree.from_lists([[1, 2, 3]], [[-1, 0, 2]])
    with pytest.raises(ValueError, match="shifted"):
        build_draft_tree(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 2, 3, dtype=torch.long),
                         torch.tensor([1, 2]), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.long),
                         ReAnchorConfig())


def test_explicit_sites_override_the_policy():
    baseline = [[9, 1, 2, 1, 2]]
    shifted = [[[1, 5, 6, 7, 8], [1, 5, 6, 7, 8]]]
    cfg = ReAnchorConfig(offsets=(1, 2), node_budget=64)
    tree = build_draft_tree(
        torch.tensor(baseline), torch.tensor(shifted), torch.tensor([1, 2]), torch.ones(1, 2, dtype=torch.bool),
        torch.zeros(1, 3, dtype=torch.long), cfg, sites=torch.tensor([[1, 3]]),
    )
    assert tree.row_sites.tolist() == [[1, 3]]
    # the same row hangs below depth 0 (merged into g1) and below depth 2 (merged into g3)
    assert tree_lists(tree)[0] == [9, 1, 2, 1, 2, 5, 6, 7, 8, 5, 6, 7, 8]
    skipped = build_draft_tree(
        torch.tensor(baseline), torch.tensor(shifted), torch.tensor([1, 2]), torch.ones(1, 2, dtype=torch.bool),
        torch.zeros(1, 3, dtype=torch.long), cfg, sites=torch.tensor([[-1, 0]]),  # 0: anchor 1 != root 9
    )
    assert skipped.row_sites.tolist() == [[-1, -1]] and int(skipped.num_nodes[0]) == 5


# ---- branches ------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(tree_inputs(), st.data())
def test_branches_join_the_trie_after_the_rows(inputs, data):
    """Branches (`tree.Branches`) are chains below the baseline, inserted after the shifted rows."""
    from sglang_reanchor.tree import Branches

    baseline, shifted, offsets, valid, rejected, cfg = inputs
    bs, block = len(baseline), len(baseline[0])
    m = data.draw(st.integers(1, 4))
    tok = st.integers(0, 4)
    b_tokens = [[data.draw(st.lists(tok, min_size=block, max_size=block)) for _ in range(m)] for _ in range(bs)]
    b_sites = [[data.draw(st.integers(-1, block - 1)) for _ in range(m)] for _ in range(bs)]
    b_lens = [[data.draw(st.integers(1, block)) for _ in range(m)] for _ in range(bs)]
    branches = Branches(torch.tensor(b_tokens), torch.tensor(b_sites), torch.tensor(b_lens))
    rows = len(offsets)
    tree = build_draft_tree(
        torch.tensor(baseline), torch.tensor(shifted, dtype=torch.long).reshape(bs, rows, block),
        offsets=torch.tensor(offsets, dtype=torch.long), row_valid=torch.tensor(valid, dtype=torch.bool).reshape(bs, rows),
        rejected_tokens=torch.tensor(rejected), config=cfg, branches=branches,
    )
    for b in range(bs):
        rows_b = [r for r, v in zip(shifted[b], valid[b]) if v]
        offs = [d for d, v in zip(offsets, valid[b]) if v]
        full = cfg.replace(node_budget=10_000)
        tokens, parents, depth, _ = oracle_tree(baseline[b], rows_b, offs, rejected[b], full)
        # the branches, in order, each below baseline node site - 1 (the oracle's trie, continued)
        child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens)) if p >= 0}
        base_nodes = [0]  # the baseline chain's nodes, root first
        for j in range(1, block):
            if (base_nodes[-1], baseline[b][j]) not in child:
                break  # cut by the depth cap
            base_nodes.append(child[(base_nodes[-1], baseline[b][j])])
        cap = cfg.max_depth if cfg.max_depth is not None else 2 * block
        for row, site, length in zip(b_tokens[b], b_sites[b], b_lens[b]):
            if site < 1 or site - 1 >= len(base_nodes):
                continue
            cur = base_nodes[site - 1]
            for k, t in enumerate(row[:length]):
                if site + k > cap:
                    break
                if (cur, t) not in child:
                    child[(cur, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(cur)
                    depth.append(site + k)
                cur = child[(cur, t)]
        n = min(len(tokens), cfg.node_budget)
        assert tree_lists(tree, b) == (tokens[:n], parents[:n], depth[:n])
        assert int(tree.source_row[b, :n].max()) <= rows + m


def test_kept_drafts_cut_where_the_running_product_falls_below_the_threshold():
    core = RoundCore(ReAnchorConfig(offsets=(1,), verify_threshold=0.3), num_drafts=4, device="cpu")
    probs = torch.tensor([[[0.9, 0.5, 0.9, 1.0], [0.2, 1.0, 1.0, 1.0]],
                          [[0.1, 1.0, 1.0, 1.0], [1.0, 1.0, 0.6, 0.4]]])
    # 0.9, 0.45, 0.405, 0.405 -> 4; 0.2 -> 0; 0.1 -> 0, the baseline keeps 1; 1, 1, 0.6, 0.24 -> 3
    assert core.kept_drafts(probs).tolist() == [[4, 0], [1, 3]]
    with pytest.raises(ValueError, match="needs ReAnchorConfig.verify_threshold"):
        RoundCore(ReAnchorConfig(), num_drafts=4, device="cpu").kept_drafts(probs)
    with pytest.raises(ValueError, match=r"verify_threshold must be None or a float in \(0, 1\]"):
        ReAnchorConfig(verify_threshold=0.0)
