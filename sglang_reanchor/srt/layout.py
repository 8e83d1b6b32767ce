"""One ReAnchor step in SGLang's layouts (pure torch; the worker feeds these to SGLang).

Per request ``b`` with ``s = prefix_lens[b]`` committed tokens, the step uses the
slots SGLang reserved at ``req_to_token[b, s:]`` (its *columns* below):

Draft window (one drafter forward, ``ForwardMode.TARGET_VERIFY`` on the draft runner)::

    columns  s .. s+X-1        s+X .. s+X+Q-1
             extra context     queries: 1+R blocks of B = [anchor, MASK x (B-1)]
             (rejected-suffix  block 0 at positions s+0..B-1 (anchor: bonus),
              features F)      block r at s+d_r+0..B-1 (anchor: y[s+d_r])

The drafter's attention prefix is ``s + X`` (its "seq_len"); its FULL_MASK row for a
query of block r allows the ``s`` committed columns, the first ``d_r`` extra columns
and its own block (`attention.masks.multi_anchor_mask` behind `full_mask`). Extra columns are
overwritten by the committed rows of the same step, so they never outlive it.

Verify (one target forward over the tree): node ``i`` at column ``s + i``, position
``s + depth[i]``, FULL_MASK row ``[s ones | ancestors of i]``. After acceptance the
accepted node at depth ``k`` moves from column ``s + node`` to ``s + k`` (target KV),
and its features go to the draft KV at column ``s + k``: the committed layout.

The commit (KV moves, emitted tokens) is the round core's (`sglang_reanchor.round`).
Host numbers (``max_prefix``, ``prefix_sum``: from SGLang's ``seq_lens_cpu``) come in
as Python ints, so nothing here reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attention.masks import full_mask, multi_anchor_mask

from ..indices import arange
from ..round import DraftAnchors
from ..tree import DraftTree

__all__ = ["DraftWindow", "VerifyInputs", "cap_tree", "draft_window", "verify_inputs"]


@dataclass(frozen=True)
class DraftWindow:
    """Inputs of the multi-anchor drafter forward for a batch."""

    input_ids: Tensor  # [bs, Q] long: per block [anchor, MASK x (B-1)], block-major
    positions: Tensor  # [bs, Q] long
    extra_positions: Tensor  # [bs, X] long: s .. s+X-1
    row_valid: Tensor  # [bs, R] bool: shifted row r is drafted (d_r <= suffix length)
    seq_lens: Tensor  # [bs] long: drafter attention prefix s + X
    custom_mask: Tensor  # [sum_b Q * (s_b + X + Q)] bool: FULL_MASK, True = attend
    query_columns: Tensor  # [bs, Q] long: req_to_token columns the queries write
    extra_columns: Tensor  # [bs, X] long: columns of the extra context rows


def draft_window(
    prefix_lens: Tensor,
    anchors: DraftAnchors,
    num_extra: int,
    block_size: int,
    mask_token_id: int,
    max_prefix: int,
    prefix_sum: int,
) -> DraftWindow:
    """Lay out the baseline block and one shifted block per offset for each request.

    Parameters
    ----------
    prefix_lens : ``[bs]`` long, committed tokens ``s``.
    anchors : the round core's `DraftAnchors` (``[bs, 1+R]`` tokens, positions, visible rows).
    num_extra : ``X = max(offsets)``, rejected-suffix context rows before the queries.
    block_size : ``B``.
    mask_token_id : the drafter's MASK token.
    max_prefix, prefix_sum : ``max(s)`` and ``sum(s)`` from the host (``seq_lens_cpu``).

    >>> from sglang_reanchor.round import draft_anchors
    >>> from sglang_reanchor.suffix import SuffixBatch
    >>> sfx = SuffixBatch(torch.tensor([1]), torch.zeros(1, 2, dtype=torch.long), torch.tensor([[8, 9]]),
    ...                   torch.zeros(1, 2, 3))
    >>> a = draft_anchors(torch.tensor([7]), torch.tensor([4]), sfx, torch.tensor([1, 2]), fill_token=0)
    >>> w = draft_window(torch.tensor([4]), a, 2, 2, 0, max_prefix=4, prefix_sum=4)
    >>> w.input_ids.tolist(), w.positions.tolist(), w.row_valid.tolist()
    ([[7, 0, 8, 0, 0, 0]], [[4, 5, 5, 6, 6, 7]], [[True, False]])
    >>> w.query_columns.tolist(), w.seq_lens.tolist()
    ([[6, 7, 8, 9, 10, 11]], [6])
    """
    bs, rows = anchors.tokens.shape
    dev = prefix_lens.device
    s = prefix_lens.long()
    ids = torch.full((bs, rows, block_size), mask_token_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = anchors.tokens
    j = torch.arange(block_size, device=dev)
    positions = (anchors.positions[:, :, None] + j).reshape(bs, rows * block_size)
    # every request's own committed context goes in front (full_mask), so the blocks' mask is shared-free
    mask = full_mask(multi_anchor_mask(0, anchors.visible, num_extra, block_size), s, max_prefix=max_prefix,
                     prefix_sum=prefix_sum)
    q = rows * block_size
    extra = torch.arange(num_extra, device=dev)
    return DraftWindow(
        input_ids=ids.reshape(bs, q),
        positions=positions,
        extra_positions=s[:, None] + extra,
        row_valid=anchors.row_valid,
        seq_lens=s + num_extra,
        custom_mask=mask,
        query_columns=s[:, None] + num_extra + torch.arange(q, device=dev),
        extra_columns=s[:, None] + extra,
    )


def cap_tree(tree: DraftTree, caps: Tensor, width: int) -> DraftTree:
    """The first ``caps[b]`` nodes of request ``b``'s tree (``caps``: ``[bs]`` long), ``width`` columns
    (a host number, at least ``max(caps)`` where it matters: `context_end.round_room`).

    Nodes are numbered parents first, so a prefix of them is a subtree rooted at
    node 0: acceptance on it is still exact, it only offers fewer drafts. A shifted
    row none of whose nodes is kept is no longer attached (``row_sites`` -1).

    >>> tree = DraftTree.from_lists([[3, 7, 9, 4], [3, 5, 6, 8]], [[-1, 0, 0, 1], [-1, 0, 1, 2]])
    >>> t = cap_tree(tree, torch.tensor([3, 1]), width=3)
    >>> t.tokens.tolist(), t.parents.tolist(), t.num_nodes.tolist()
    ([[3, 7, 9], [3, 0, 0]], [[-1, 0, 0], [-1, -1, -1]], [3, 1])
    """
    caps = caps.to(tree.tokens.device).long()
    n = max(1, min(tree.width, width))
    keep = (torch.arange(n, device=caps.device)[None, :] < caps[:, None]) & tree.valid[:, :n]
    source_row = torch.where(keep, tree.source_row[:, :n], 0)
    rows = tree.row_sites.shape[1]
    hit = torch.zeros(tree.batch_size, rows + 2, dtype=torch.long, device=caps.device)
    hit.scatter_(1, torch.where(keep, source_row, rows + 1), 1)  # column r + 1: shifted row r kept a node
    return DraftTree(
        tokens=torch.where(keep, tree.tokens[:, :n], 0),
        parents=torch.where(keep, tree.parents[:, :n], -1),
        depth=torch.where(keep, tree.depth[:, :n], 0),
        num_nodes=keep.sum(1),
        source_row=source_row,
        row_sites=torch.where(hit[:, 1 : rows + 1].bool(), tree.row_sites, -1),
        # a kept node's ancestors are kept (lower ids); a dropped node becomes padding
        ancestors=torch.where(keep[:, :, None], tree.ancestors[:, :n, :n],
                              torch.eye(n, dtype=torch.bool, device=caps.device)),
    )


@dataclass(frozen=True)
class VerifyInputs:
    """The target verify forward over a batch of trees, ``N`` nodes each (padded)."""

    tokens: Tensor  # [bs * N] long
    positions: Tensor  # [bs * N] long: s + depth
    custom_mask: Tensor  # [sum_b N * (s_b + N)] bool: FULL_MASK, True = attend
    columns: Tensor  # [bs, N] long: req_to_token columns s + i


def verify_inputs(tree: DraftTree, prefix_lens: Tensor, max_prefix: int, prefix_sum: int) -> VerifyInputs:
    """FULL_MASK and positions of ``tree`` after ``prefix_lens`` (``[bs]``;
    ``max_prefix``, ``prefix_sum``: its maximum and sum, from the host).

    Padding nodes (past ``tree.num_nodes[b]``) attend to the prefix and themselves.

    >>> tree = DraftTree.from_lists([[3, 7, 9]], [[-1, 0, 0]])
    >>> v = verify_inputs(tree, torch.tensor([2]), max_prefix=2, prefix_sum=2)
    >>> v.positions.tolist(), v.custom_mask.view(3, 5).int().tolist()
    ([2, 3, 3], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]])
    """
    bs, n = tree.tokens.shape
    s = prefix_lens.long().to(tree.tokens.device)
    return VerifyInputs(
        tokens=tree.tokens.reshape(-1),
        positions=tree.positions(s).reshape(-1),
        custom_mask=full_mask(tree.ancestors, s, max_prefix=max_prefix, prefix_sum=prefix_sum),
        columns=s[:, None] + arange(n, s.device),
    )
