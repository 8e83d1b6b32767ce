"""The paper's analysis statistics, computed from traced verify rounds (`RoundTrace`).

Each function maps a list of rounds to integer counts, so counts add up over
samples and datasets; `ratio` turns them into percentages.

- `post_rejection_agreement` (Table 1): baseline drafts after the first rejection
  that equal the target's top-1 at their position given the rejected path (the
  verifier computed it: ``top1`` of the node's parent).
- `start_token_alignment` (Table 5): per shifted row ``d``, where its anchor ``a_d``
  occurs among the baseline drafts ``g_1..g_{B-1}``.
- `earliest_win` (Table 8): on rounds of the diagnostic pass (`DiagnosticProposer`,
  every shifted row attached at every matching site), whether the earliest site's
  path ties the best accepted length among all paths, baseline included.
- `histogram` (Figure 2): per-round acceptance lengths.
- `budget_taus`: the tau each round would have had under a smaller node budget
  (nodes are numbered in creation order, parents first, so a budget keeps a
  prefix of every path: the accepted path's nodes with id < budget).
- `capped_taus`: the same under a depth cap and a budget together (``max_depth``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from ..config import ReAnchorConfig
from ..drafter import DFlashDrafter
from ..engine.generator import RoundTrace, SpeculativeGenerator
from ..engine.proposers import Draft, ReAnchorProposer
from ..tree import DraftTree, build_draft_tree

__all__ = [
    "DiagnosticProposer", "diagnostic_generator", "budget_taus", "capped_taus", "earliest_win", "histogram", "path_accept_length",
    "post_rejection_agreement", "ratio", "start_token_alignment",
]

DIAGNOSTIC_BUDGET = 100_000
MAX_SITES = 8  # diagnostic pass: attachment sites per row, earliest first (bounds the verified tree)


def ratio(num: int, den: int) -> float:
    """``100 * num / den`` (NaN when ``den == 0``)."""
    return 100.0 * num / den if den else float("nan")


def post_rejection_agreement(rounds: Iterable[RoundTrace]) -> dict[str, int]:
    """Table 1 counts: ``{"tokens": post-rejection baseline drafts, "agree": those equal to top-1}``.

    The baseline chain is nodes ``0..B-1`` (creation order). With first rejection
    at depth ``k`` (``g_k != top1[k-1]``), positions ``j = k+1..B-1`` count, and
    agree when ``g_j == top1[j-1]``. Rounds that accept the whole block count nothing.
    """
    tokens = agree = 0
    for r in rounds:
        n = min(r.blocks.shape[1], int(r.tree.num_nodes[0]))
        g, top1 = r.tree.tokens[0, :n], r.top1[:n]
        hit = (g[1:] == top1[:-1]).tolist()  # hit[j-1]: does g_j match the target after g_{j-1}
        if all(hit):
            continue
        k = hit.index(False) + 1  # first rejected depth
        post = hit[k:]  # depths k+1..n-1
        tokens += len(post)
        agree += sum(post)
    return {"tokens": tokens, "agree": agree}


def start_token_alignment(rounds: Iterable[RoundTrace]) -> dict[str, int]:
    """Table 5 counts over shifted rows (one per round and offset ``d``).

    ``rows``: rows drafted; ``any_match``: ``a_d`` equals some ``g_j``, ``j >= 1``;
    ``at_offset``: ``g_d == a_d``; ``shifted_only``: matches, none at ``j = d``;
    ``multiple``: matches at more than one ``j``.
    """
    c: Counter[str] = Counter({"rows": 0, "any_match": 0, "at_offset": 0, "shifted_only": 0, "multiple": 0})
    for r in rounds:
        g = r.blocks[0, 1:].tolist()  # g_1..g_{B-1}
        for row, d in enumerate(r.offsets):
            a = int(r.blocks[row + 1, 0])
            sites = [j + 1 for j, tok in enumerate(g) if tok == a]
            c["rows"] += 1
            c["any_match"] += bool(sites)
            c["at_offset"] += d in sites
            c["shifted_only"] += bool(sites) and d not in sites
            c["multiple"] += len(sites) > 1
    return dict(c)


def _node_index(tree: DraftTree) -> dict[tuple[int, ...], int]:
    """Token path from the root (root token included) -> node id, for a batch-1 tree."""
    index: dict[tuple[int, ...], int] = {}
    paths: list[tuple[int, ...]] = []
    toks, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    for i in range(int(tree.num_nodes[0])):
        path = (paths[parents[i]] if parents[i] >= 0 else ()) + (toks[i],)
        paths.append(path)
        index[path] = i
    return index


def path_accept_length(path: Sequence[int], index: dict[tuple[int, ...], int], top1: Sequence[int]) -> int:
    """Accepted drafts along a token ``path`` (root token first) given ``top1`` per node id.

    Stops at the first draft the target rejects or whose node is not in the tree.
    """
    k = 0
    while k + 1 < len(path):
        node = index.get(tuple(path[: k + 1]))
        if node is None or top1[node] != path[k + 1]:
            break
        k += 1
    return k


def earliest_win(rounds: Iterable[RoundTrace], max_sites: int = MAX_SITES) -> dict[str, int]:
    """Table 8 counts on diagnostic rounds: ``{"groups", "tested", "wins", "capped"}``.

    A group is a (round, offset ``d``) whose row has at least one matching site
    ``j >= 1`` (``g_j == a_d``). Each attachment path ``g_0..g_{j-1}, a_d, e_1..``
    and the baseline path get their accepted length from the verified ``top1``.
    A group is *tested* when one of its paths ties the round's maximum; the
    earliest site *wins* when its path ties it too. Only the first ``max_sites``
    sites of a row were verified (`DiagnosticProposer`); ``capped`` counts the
    groups that had more.
    """
    c = {"groups": 0, "tested": 0, "wins": 0, "capped": 0}
    for r in rounds:
        index, top1 = _node_index(r.tree), r.top1.tolist()
        base = r.blocks[0].tolist()
        best = path_accept_length(base, index, top1)
        per_group: list[list[int]] = []  # accepted length per site, earliest site first
        for row in range(len(r.offsets)):
            shifted = r.blocks[row + 1].tolist()
            sites = [j for j in range(1, len(base)) if base[j] == shifted[0]]
            if not sites:
                continue
            c["capped"] += len(sites) > max_sites
            sites = sites[:max_sites]
            lengths = [path_accept_length(base[:j] + shifted, index, top1) for j in sites]
            per_group.append(lengths)
            best = max(best, *lengths)
        for lengths in per_group:
            c["groups"] += 1
            if max(lengths) == best:
                c["tested"] += 1
                c["wins"] += lengths[0] == best
    return c


def histogram(taus: Iterable[int]) -> dict[int, int]:
    """Figure 2: ``{tau: rounds}``."""
    return dict(sorted(Counter(int(t) for t in taus).items()))


def budget_taus(rounds: Iterable[RoundTrace], budgets: Sequence[int]) -> dict[int, list[int]]:
    """Per budget ``b``: each round's tau had only nodes ``< b`` been verified (see module doc)."""
    out: dict[int, list[int]] = {b: [] for b in budgets}
    for r in rounds:
        ids = r.accepted_nodes
        for b in budgets:
            out[b].append(int((ids < b).sum()))
    return out


def capped_taus(rounds: Iterable[RoundTrace], budgets: Sequence[int],
                depths: Sequence[int]) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (budget ``b``, depth cap ``m``): summed (tau, verified nodes) over ``rounds``
    had only nodes at depth ``<= m`` been kept, then the first ``b`` of them.

    The engine's cut (``ReAnchorConfig.max_depth``) drops the deep nodes before the
    budget numbers the rest in creation order, so a node survives when its rank
    among the shallow nodes is below ``b``; the accepted path, parents first, keeps
    a prefix. With the same drafts, this is the round's tau under that cut.
    """
    out = {(b, m): (0, 0) for b in budgets for m in depths}
    for r in rounds:
        n = int(r.tree.num_nodes[0])
        depth = r.tree.depth[0, :n]
        for m in depths:
            shallow = depth <= m
            rank = shallow.long().cumsum(0) - 1  # rank of each shallow node in creation order
            path = r.accepted_nodes
            for b in budgets:
                tau = int((shallow[path] & (rank[path] < b)).sum())
                nodes = min(int(shallow.sum()), b)
                t, k = out[(b, m)]
                out[(b, m)] = (t + tau, k + nodes)
    return out


def mean_tree_size(rounds: Iterable[RoundTrace], budget: int) -> float:
    """Mean verified nodes per round under node budget ``budget``."""
    sizes = [min(int(r.tree.num_nodes[0]), budget) for r in rounds]
    return sum(sizes) / len(sizes) if sizes else float("nan")


class DiagnosticProposer(ReAnchorProposer):
    """ReAnchor that attaches every shifted row at *every* matching baseline site.

    Used only for Table 8: one target forward verifies every attachment path of
    every row, so each path's accepted length is known. Decoding stays exact (any
    draft tree is), but its speed means nothing. The node budget is lifted; each
    row goes to its first `MAX_SITES` matching sites at most.
    """

    def tree(self, draft: Draft, node_budget: int, generator: torch.Generator) -> DraftTree:
        del node_budget, generator  # lifted: every site of every row is verified, none drawn
        blocks, offsets, rejected = draft.valid_rows()
        base, rows = blocks[:, 0], blocks[:, 1:]  # [1, B], [1, R, B]
        dup_rows, dup_offsets, dup_sites = [], [], []
        for r, d in enumerate(offsets):
            matches = [j for j in range(1, base.shape[1]) if int(base[0, j]) == int(rows[0, r, 0])]
            for j in matches[:MAX_SITES]:  # sites j >= 1, as in `earliest_win`
                dup_rows.append(rows[0, r])
                dup_offsets.append(d)
                dup_sites.append(j)
        if not dup_rows:
            return DraftTree.chain(base)
        dev = base.device
        return build_draft_tree(
            base,
            torch.stack(dup_rows)[None],
            offsets=torch.tensor(dup_offsets, dtype=torch.long, device=dev),
            row_valid=torch.ones(1, len(dup_rows), dtype=torch.bool, device=dev),
            rejected_tokens=rejected,
            config=self.drafting.core.config.replace(node_budget=DIAGNOSTIC_BUDGET, region="all"),
            sites=torch.tensor([dup_sites], dtype=torch.long, device=dev),
        )


def diagnostic_generator(target: torch.nn.Module, drafter: DFlashDrafter, config: ReAnchorConfig) -> SpeculativeGenerator:
    """A generator whose ``"reanchor"`` method is `DiagnosticProposer`'s (the Table 8 pass)."""
    return SpeculativeGenerator(target, drafter, config, proposers={"reanchor": DiagnosticProposer})
