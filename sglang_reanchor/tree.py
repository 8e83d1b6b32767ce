"""Draft trees: built from a baseline block plus shifted blocks, compiled for verification.

A draft tree is a trie of draft tokens rooted at the bonus token ``b`` (the last
committed token, at position ``s``). Node ``i`` at depth ``t`` sits at position
``s + t`` and is verified attending to the committed prefix and its ancestors.

Nodes are numbered in *creation order*: the baseline chain ``b, g1, ..., g(B-1)``
first, then each attached shifted row (ascending offset ``d``), shallow to deep.
Hence every parent index is smaller than its child's, a node's ancestors are
exactly the lower-numbered nodes on its path, and truncating to the first
``node_budget`` nodes drops "the deepest nodes of the last-attached rows first"
while leaving a valid tree.

Shapes never depend on the drafts: a batch of trees is padded to the width
``N = min(node_budget, (1 + R) * B)``, known on the host before the drafter runs,
and building one reads nothing back from the device (a CUDA graph can hold it;
`tests/test_round_syncs.py` checks). Padding nodes see the prefix and themselves.

Worked example (``B = 4``, one shifted row ``d = 1`` with anchor ``a1 = 7`` whose
drafts are ``[9, 5, 6]``; baseline ``[3, 7, 8, 4]``; policy ``earliest``)::

    baseline: 3 -> 7 -> 8 -> 4          depths 0..3
    row d=1 : 7 -> 9 -> 5 -> 6          a1 == g1 == 7, so it attaches at depth 1
    trie    : 3 ─ 7 ┬ 8 ─ 4             node ids: 0:3 1:7 2:8 3:4 4:9 5:5 6:6
                    └ 9 ─ 5 ─ 6         (a1 merged into node 1)

>>> import torch
>>> from sglang_reanchor.config import ReAnchorConfig
>>> tree = build_draft_tree(
...     torch.tensor([[3, 7, 8, 4]]), torch.tensor([[[7, 9, 5, 6]]]),
...     offsets=torch.tensor([1]), row_valid=torch.tensor([[True]]),
...     rejected_tokens=torch.tensor([[2]]), config=ReAnchorConfig(offsets=(1,)))
>>> tree.width, tree.num_nodes.tolist()   # fixed width min(node_budget, (1 + R) * B) = 8
(8, [7])
>>> tree.tokens.tolist(), tree.parents.tolist(), tree.depth.tolist()   # node 7 is padding
([[3, 7, 8, 4, 9, 5, 6, 0]], [[-1, 0, 1, 2, 1, 4, 5, -1]], [[0, 1, 2, 3, 2, 3, 4, 0]])
>>> tree.row_sites.tolist()   # depth at which each shifted row's anchor sits
[[1]]
>>> [t.tolist() for t in tree.trimmed().retrieve_arrays()]  # SGLang's pointer arrays
[[[0, 1, 2, 3, 4, 5, 6]], [[1, 2, 3, -1, 5, 6, -1]], [[-1, -1, 4, -1, -1, -1, -1]]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attention.masks import padded_ancestor_mask

from .config import ReAnchorConfig
from .indices import arange, diagonal, lower_triangle, shared_per_size

__all__ = ["Branches", "DraftTree", "build_draft_tree"]


@dataclass(frozen=True)
class Branches:
    """Alternative drafts of the baseline block: short chains hanging below it (`sglang_reanchor.branching`).

    Row ``m`` is the ``m``-th alternative token at depth ``sites[b, m]`` followed by the
    baseline's own later drafts; only its first ``lengths[b, m]`` tokens become nodes.
    """

    tokens: Tensor  # [bs, M, W] long: [alternative, g_{t+1}, ..., ] (past lengths: unused)
    sites: Tensor  # [bs, M] long: depth t >= 1 of the alternative; -1 = no branch
    lengths: Tensor  # [bs, M] long in [1, W]: tokens of the row that become nodes


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft tries, padded to ``N`` nodes (node 0 is the root).

    Padding nodes (``i >= num_nodes[b]``) carry token 0, parent -1, depth 0.
    """

    tokens: Tensor  # [bs, N] long: draft token of each node (node 0: the bonus token)
    parents: Tensor  # [bs, N] long: parent node id; -1 for the root and for padding
    depth: Tensor  # [bs, N] long: depth below the root (root 0)
    num_nodes: Tensor  # [bs] long: real nodes per request
    source_row: Tensor  # [bs, N] long: row that created the node (0 baseline, r+1 shifted row r, then branches)
    row_sites: Tensor  # [bs, R] long: depth where shifted row r's anchor sits; -1 = not attached
    ancestors: Tensor  # [bs, N, N] bool: [b, i, j] iff j is i or an ancestor of i (padding: itself only)

    # ---- constructors -------------------------------------------------------------

    @staticmethod
    def chain(tokens: Tensor, num_nodes: Tensor | None = None) -> DraftTree:
        """The DFlash baseline: a chain ``tokens[:, 0] -> tokens[:, 1] -> ...``.

        ``tokens``: ``[bs, B]`` long; ``num_nodes`` ``[bs]`` long in ``[1, B]``: each chain's
        first nodes (the rest padding), None for all ``B``.
        """
        bs, n = tokens.shape
        dev = tokens.device
        idx = torch.arange(n, device=dev).expand(bs, n)
        if num_nodes is None:
            return DraftTree(
                tokens=tokens.long(),
                parents=idx - 1,
                depth=idx.clone(),
                num_nodes=torch.full((bs,), n, dtype=torch.long, device=dev),
                source_row=torch.zeros_like(idx),
                row_sites=torch.zeros(bs, 0, dtype=torch.long, device=dev),
                ancestors=torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(bs, n, n),
            )
        real = idx < num_nodes[:, None]  # padding: token 0, parent -1, depth 0, sees itself only
        return DraftTree(
            tokens=torch.where(real, tokens.long(), 0),
            parents=torch.where(real, idx - 1, -1),
            depth=torch.where(real, idx, 0),
            num_nodes=num_nodes.long(),
            source_row=torch.zeros_like(idx),
            row_sites=torch.zeros(bs, 0, dtype=torch.long, device=dev),
            ancestors=(torch.ones(n, n, dtype=torch.bool, device=dev).tril() & real[:, None, :] & real[:, :, None])
            | torch.eye(n, dtype=torch.bool, device=dev),
        )

    @staticmethod
    def from_lists(tokens: list[list[int]], parents: list[list[int]]) -> DraftTree:
        """Test constructor from per-request lists (parents precede children).

        >>> DraftTree.from_lists([[5, 6, 7]], [[-1, 0, 0]]).depth.tolist()
        [[0, 1, 1]]
        """
        if len(tokens) != len(parents) or any(len(t) != len(p) for t, p in zip(tokens, parents)):
            raise ValueError("tokens and parents must have the same ragged shape")
        bs, n = len(tokens), max(len(t) for t in tokens)
        tok = torch.zeros(bs, n, dtype=torch.long)
        par = torch.full((bs, n), -1, dtype=torch.long)
        dep = torch.zeros(bs, n, dtype=torch.long)
        for b, (ts, ps) in enumerate(zip(tokens, parents)):
            if not ts or ps[0] != -1:
                raise ValueError(f"request {b}: node 0 must be a root with parent -1")
            for i, (t, p) in enumerate(zip(ts, ps)):
                if i > 0 and not 0 <= p < i:
                    raise ValueError(f"request {b}: parent of node {i} must be in [0, {i}), got {p}")
                tok[b, i], par[b, i] = t, p
                dep[b, i] = 0 if i == 0 else dep[b, p] + 1
        return DraftTree(
            tokens=tok,
            parents=par,
            depth=dep,
            num_nodes=torch.tensor([len(t) for t in tokens], dtype=torch.long),
            source_row=torch.zeros(bs, n, dtype=torch.long),
            row_sites=torch.zeros(bs, 0, dtype=torch.long),
            ancestors=padded_ancestor_mask(par),
        )

    # ---- views ----------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        """``N``: padded node count."""
        return self.tokens.shape[1]

    @property
    def valid(self) -> Tensor:
        """``[bs, N]`` bool: real (non-padding) nodes."""
        return arange(self.width, self.tokens.device) < self.num_nodes[:, None]

    def positions(self, prefix_lens: Tensor) -> Tensor:
        """``[bs, N]`` long: absolute positions ``prefix_lens[b] + depth`` (``prefix_lens``: ``[bs]``)."""
        return prefix_lens[:, None].to(self.depth) + self.depth

    def ancestor_mask(self) -> Tensor:
        """``[bs, N, N]`` bool: ``[b, i, j]`` is True iff ``j`` is ``i`` or an ancestor of ``i``.

        Built once with the tree (``ancestors``); padding nodes see only themselves.
        """
        return self.ancestors

    def trimmed(self) -> DraftTree:
        """The same trees cut to the widest real one (``max(num_nodes)`` columns).

        Reads ``num_nodes`` on the host: for a CPU, where the read is free and every
        padding node costs a verified token, and for tests. The round core itself
        keeps the fixed width.
        """
        n = max(1, int(self.num_nodes.max()))
        if n == self.width:
            return self
        return DraftTree(
            tokens=self.tokens[:, :n], parents=self.parents[:, :n], depth=self.depth[:, :n],
            num_nodes=self.num_nodes, source_row=self.source_row[:, :n], row_sites=self.row_sites,
            ancestors=self.ancestors[:, :n, :n],
        )

    def to(self, device: torch.device | str) -> DraftTree:
        """Every field on ``device``."""
        return DraftTree(**{f: getattr(self, f).to(device) for f in DraftTree.__dataclass_fields__})

    def retrieve_arrays(self) -> tuple[Tensor, Tensor, Tensor]:
        """SGLang's tree pointers, each ``[bs, N]`` long (-1 = none).

        Returns ``(retrieve_index, retrieve_next_token, retrieve_next_sibling)``:
        the flat node index ``b * N + i``, the first (lowest-numbered) child, and
        the next higher-numbered sibling.
        """
        bs, n = self.parents.shape
        dev = self.parents.device
        idx = torch.arange(n, device=dev).expand(bs, n)
        valid = self.valid
        retrieve_index = torch.where(valid, idx + n * torch.arange(bs, device=dev)[:, None], -1)

        is_child = valid & (self.parents >= 0)
        first_child = torch.full((bs, n + 1), n, dtype=torch.long, device=dev)
        slot = torch.where(is_child, self.parents, n)  # non-children land in the spare column
        first_child.scatter_reduce_(1, slot, torch.where(is_child, idx, n), reduce="amin")
        next_token = first_child[:, :n]
        next_token = torch.where(next_token == n, -1, next_token)

        same_parent = (self.parents[:, :, None] == self.parents[:, None, :]) & is_child[:, :, None]
        later = idx[:, None, :] > idx[:, :, None]
        candidates = same_parent & later & is_child[:, None, :]
        sibling = torch.where(candidates, idx[:, None, :], n).amin(dim=2)
        next_sibling = torch.where(sibling == n, -1, sibling)
        return retrieve_index, next_token, next_sibling


def build_draft_tree(
    baseline: Tensor,
    shifted: Tensor,
    offsets: Tensor,
    row_valid: Tensor,
    rejected_tokens: Tensor,
    config: ReAnchorConfig,
    generator: torch.Generator | None = None,
    sites: Tensor | None = None,
    branches: Branches | None = None,
    row_drafts: Tensor | None = None,
) -> DraftTree:
    """Attach shifted blocks (and branches) to the baseline chain and merge them into one trie.

    Parameters
    ----------
    baseline:
        ``[bs, W]`` long: the bonus token ``b`` then ``W - 1`` baseline drafts.
    shifted:
        ``[bs, R, W]`` long: row ``r`` is ``a_d`` (the target's top-1 at ``s + d``)
        then its ``W - 1`` drafts, for ``d = offsets[r]``.
    offsets:
        ``[R]`` long, on the device: the offset ``d`` of each row.
    row_valid:
        ``[bs, R]`` bool: False where request ``b`` has no row ``r`` (its stored
        rejected suffix is shorter than ``d``).
    rejected_tokens:
        ``[bs, L]`` long: rejected-suffix tokens at positions ``s, s+1, ...``
        (padding anywhere past a row's ``d`` is never read); used by
        ``longest_prefix``.
    config:
        Attachment policy, root site, fallback, region, node budget and depth cap.
    generator:
        Source of randomness for ``policy="random"`` (a CPU generator).
    sites:
        ``[bs, R]`` long, optional: attach row ``r`` at exactly this depth,
        bypassing ``config.policy`` (-1 = skip). For analysis, e.g. verifying one
        row at several sites (the paper's Table 8).
    branches:
        Alternative drafts of the baseline block (`sglang_reanchor.branching`): short
        chains hanging below the baseline, created after the shifted rows (so a node
        budget drops them first), kept whole by the ``region`` ablation.
    row_drafts:
        ``[bs, 1 + R]`` long, optional: drafts kept of the baseline (``>= 1``) and of each
        shifted row (``>= 0``: a row keeps its anchor), e.g. where the drafter's confidence
        runs out (``config.verify_threshold``). A row (or branch) is attached only where
        the baseline node above its site is kept.

    Returns
    -------
    DraftTree
        Nodes in creation order, at most ``config.node_budget`` per request, none
        deeper than ``config.max_depth``, padded to the fixed width
        ``min(node_budget, (1 + R) * W)``: no shape depends on the drafts, and
        nothing here reads the device.

    How: every row is laid on one depth grid ``[bs, 1 + R, 2W]`` as its full token
    path from the root (the baseline above its site, the row below). Two cells at
    depth ``t`` are one trie node iff their rows' paths agree down to ``t`` (a
    cumulative product over depth); a cell's node is the first kept row holding that
    path, and a node's parent is the node of its row's cell one level up.
    """
    bs, width = baseline.shape
    rows = shifted.shape[1]
    if shifted.shape != (bs, rows, width) or offsets.shape != (rows,) or row_valid.shape != (bs, rows):
        raise ValueError(
            f"expected shifted [bs, R, W], offsets [R], row_valid [bs, R] for baseline {tuple(baseline.shape)}; "
            f"got {tuple(shifted.shape)}, {tuple(offsets.shape)}, {tuple(row_valid.shape)}"
        )
    dev = baseline.device
    if sites is None:
        sites, attached = _attach_sites(baseline, shifted, offsets, row_valid, rejected_tokens, config, generator)
    else:
        attached = row_valid & (sites >= 0) & (sites <= width) & ((sites > 0) | (shifted[:, :, 0] == baseline[:, :1]))
        sites = sites.clamp(min=0)
    shifted_rows = rows
    row_len = None
    if branches is not None:  # more rows, at their own sites, each kept to its length
        shifted = torch.cat([shifted, branches.tokens], dim=1)
        attached = torch.cat([attached, branches.sites >= 1], dim=1)
        sites = torch.cat([sites, branches.sites.clamp(min=0)], dim=1)
        row_len = torch.cat([torch.full_like(sites[:, :rows], width), branches.lengths], dim=1)
        rows = shifted.shape[1]
    # an attached row hangs at depth <= W; a row left out may name a site past the block
    # (an offset d > W): it keeps no cell, but its grid indices must stay in range
    sites = sites.clamp(max=width)
    if row_drafts is not None:  # a row hangs below baseline depth site - 1, which must be kept
        attached = attached & (sites <= row_drafts[:, :1] + 1)
    grid = 2 * width  # depths 0 .. 2W-1: a row attached at depth W reaches 2W-1
    num = 1 + rows
    n = min(config.node_budget, num * width)  # the fixed verify width N

    # ---- every row's full token path on the depth grid: [bs, 1+R, G]
    t = arange(grid, dev)
    base_path = torch.nn.functional.pad(baseline, (0, width), value=-1)  # [bs, G]
    k = t - sites[:, :, None]  # [bs, R, G]: index into the row (< 0: above its site)
    k_in = k.clamp(0, width - 1)
    in_row = k_in == k
    # above its site a row is the baseline; below its last draft, nothing (-1, as the baseline there)
    row_path = torch.where(in_row, shifted.gather(2, k_in), base_path[:, None, :])
    paths = torch.cat([base_path[:, None, :], row_path], dim=1)  # [bs, 1+R, G]

    # ---- candidate cells: the baseline's W, each attached row's W (region, depth cap)
    keep_rows = attached[:, :, None] & in_row
    if row_len is not None:
        keep_rows = keep_rows & (k < row_len[:, :, None])
    if row_drafts is not None:  # cell k of a shifted row is its anchor (k = 0) or its k-th draft
        cut = torch.nn.functional.pad(row_drafts[:, 1:], (0, rows - shifted_rows), value=width)
        keep_rows = keep_rows & (k <= cut[:, :, None])
    if config.region != "all":
        region = _region_keep(config, baseline, shifted[:, :shifted_rows], sites[:, :shifted_rows],
                              sites[:, :shifted_rows, None] + t[:width], width)  # [bs, R, W]
        region = torch.cat([region, torch.ones_like(shifted[:, shifted_rows:], dtype=torch.bool)], dim=1)
        keep_rows = keep_rows & region.gather(2, k_in)
    base_keep = (t < width).expand(bs, grid) if row_drafts is None else t <= row_drafts[:, :1]  # [bs, G]
    keep = torch.cat([base_keep[:, None, :], keep_rows], dim=1)  # [bs, 1+R, G]
    if config.max_depth is not None:  # a node's parent is shallower, so the cut leaves a tree
        keep = keep & (t <= config.max_depth)

    # ---- merge: same[b, r, q, t] = rows r and q share the path down to depth t
    # (bool as uint8 views: cummin and argmax need a number type, a view costs no kernel)
    same = (paths[:, :, None, :] == paths[:, None, :, :]).view(torch.uint8).cummin(dim=3).values.view(torch.bool)
    owner = (same & keep[:, None, :, :]).view(torch.uint8)  # q keeps a cell on r's path at depth t
    rep = owner.argmax(dim=2)  # [bs, 1+R, G]: the first such row (r itself if r keeps the cell)
    row_ids = arange(num, dev)[None, :, None]
    is_node = (keep & (rep == row_ids)).reshape(bs, num * grid)  # creation order: row-major
    node_id = is_node.cumsum(dim=1) - 1
    in_budget = is_node & (node_id < n)
    cell_node = node_id.view(bs, num, grid).gather(1, rep)  # [bs, 1+R, G]: node of each cell's path
    parent = torch.nn.functional.pad(cell_node[:, :, :-1], (1, 0), value=-1)  # the cell one level up

    slot = torch.where(in_budget, node_id, n)  # cells that are no node go to a spare column
    # the node fields in one scatter: token, parent, depth, source row of each cell; padding 0 / -1 / 0 / 0
    fields = torch.stack([paths, parent, t.expand(bs, num, grid), row_ids.expand(bs, num, grid)], dim=1)
    out = _padding_fields(n + 1, str(dev)).expand(bs, 4, n + 1).clone()
    out = out.scatter_(2, slot[:, None, :].expand(bs, 4, -1), fields.view(bs, 4, -1))[:, :, :n]

    # ancestors of the node at cell (r, t): the nodes of r's cells at depths <= t; and every
    # column sees itself (a padding node sees only itself)
    above = lower_triangle(grid, dev)  # [G, G]: (t, t') with t' <= t
    cols = cell_node[:, :, None, :].expand(bs, num, grid, grid)  # [bs, 1+R, G, G]
    cols = torch.where(above & (cols < n), cols, n)  # (a cell past the budget is in no node's path)
    flat = (slot.view(bs, num, grid, 1) * (n + 1) + cols).reshape(bs, -1)
    anc = torch.zeros(bs, (n + 1) * (n + 1), dtype=torch.bool, device=dev)
    anc = anc.scatter_(1, torch.cat([flat, diagonal(n, dev).expand(bs, n)], dim=1), True)
    anc = anc.view(bs, n + 1, n + 1)[:, :n, :n]

    # a row is attached where its anchor's cell is kept and inside the budget (shifted rows only)
    site = sites[:, :shifted_rows, None]
    anchor_kept = keep_rows[:, :shifted_rows].gather(2, site).squeeze(2)  # (implies attached)
    anchor_node = cell_node[:, 1 : 1 + shifted_rows].gather(2, site).squeeze(2)
    return DraftTree(
        tokens=out[:, 0],
        parents=out[:, 1],
        depth=out[:, 2],
        num_nodes=in_budget.sum(dim=1),
        source_row=out[:, 3],
        row_sites=torch.where(anchor_kept & (anchor_node < n), sites[:, :shifted_rows], -1),
        ancestors=anc,
    )


@shared_per_size
def _padding_fields(n: int, device: str) -> Tensor:
    """``[4, n]`` long: a padding node's token, parent, depth and source row (0, -1, 0, 0); read only."""
    out = torch.zeros(4, n, dtype=torch.long, device=device)
    out[1] = -1
    return out


def _attach_sites(
    baseline: Tensor,
    shifted: Tensor,
    offsets: Tensor,
    row_valid: Tensor,
    rejected_tokens: Tensor,
    config: ReAnchorConfig,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Depth ``j`` where each row's anchor goes, and whether the row is attached.

    Returns ``(sites [bs, R] long, attached [bs, R] bool)``.
    """
    bs, block = baseline.shape
    rows = shifted.shape[1]
    dev = baseline.device
    offset = offsets.long().expand(bs, rows)
    # A row attached "at its offset" hangs below baseline depth d-1, which must exist.
    offset_ok = row_valid & (offset <= block)
    if config.policy == "offset" or rows == 0:
        return offset, offset_ok

    match = baseline[:, None, :] == shifted[:, :, :1]  # [bs, R, B]: g_j == a_d
    j = arange(block, dev)
    if not config.root_site:
        match = match & (j > 0)
    if config.policy == "earliest":
        score = match.view(torch.uint8)  # argmax: the first match
    elif config.policy == "random":
        noise = torch.rand(bs, rows, block, generator=generator, device="cpu").to(dev)
        score = torch.where(match, noise, -float("inf"))
    else:  # longest_prefix: agreement of g[j-1-i] with r[d-1-i], i = 0, 1, ...
        width = rejected_tokens.shape[1]
        i = torch.arange(max(width, 1), device=dev)
        g_idx = j[None, None, :, None] - 1 - i  # [1, 1, B, L]
        r_idx = offset[:, :, None, None] - 1 - i  # [bs, R, 1, L]
        ok = (g_idx >= 0) & (r_idx >= 0) & (r_idx < width)
        g = baseline[:, None, :].expand(bs, rows, block).gather(2, g_idx.clamp(min=0).reshape(1, 1, -1).expand(bs, rows, -1))
        g = g.reshape(bs, rows, block, -1)
        padded = rejected_tokens if width else torch.zeros(bs, 1, dtype=torch.long, device=dev)
        r = padded[:, None, None, :].expand(bs, rows, block, -1).gather(3, r_idx.clamp(0, max(width - 1, 0)).expand(bs, rows, block, -1))
        agree = (ok & (g == r)).long().cumprod(dim=3).sum(dim=3).float()
        # Ties go to the earliest site (argmax returns the first maximum).
        score = torch.where(match, agree, -float("inf"))
    has_match = match.any(dim=2) & row_valid
    best = score.argmax(dim=2)
    if config.fallback == "offset":
        sites = torch.where(has_match, best, offset)
        return sites, has_match | offset_ok
    return best, has_match


def _region_keep(
    config: ReAnchorConfig,
    baseline: Tensor,
    shifted: Tensor,
    sites: Tensor,
    depth_rows: Tensor,
    block: int,
) -> Tensor:
    """``[bs, R, B]`` bool: which shifted-row nodes the Table 4 ablation keeps.

    ``in_block`` keeps row nodes at depth ``<= B-1``. ``beyond`` keeps row nodes
    that coincide with the baseline up to depth ``B-1`` and everything below it,
    so shifted predictions are used only past the block's end. A row is a chain,
    so a node is kept only if all its row predecessors are (a cumulative product).
    """
    if config.region == "all":
        return torch.ones_like(depth_rows, dtype=torch.bool)
    if config.region == "in_block":
        return depth_rows <= block - 1
    bs, rows, _ = shifted.shape
    base_at = baseline[:, None, :].expand(bs, rows, block).gather(2, depth_rows.clamp(max=block - 1))
    on_baseline = (shifted == base_at) & (depth_rows <= block - 1)
    ok = on_baseline | (depth_rows > block - 1)
    return ok.long().cumprod(dim=2).bool()
