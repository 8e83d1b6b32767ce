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

Worked example (``s = 5``; path root 0 -> node 1 -> node 4 -> node 5)::

    accepted_nodes [0, 1, 4, 5]  ->  KV moves  window slot 4 -> 2, 5 -> 3
                                     (columns 9 -> 7, 10 -> 8)
    commit_lens 4, new seq_len 9;  out_tokens = tokens[1], tokens[4], tokens[5], bonus
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attention.masks import full_mask, multi_anchor_mask

from ..tree import DraftTree
from ..verify import Acceptance

__all__ = ["CommitPlan", "DraftWindow", "VerifyInputs", "cap_tree", "commit_plan", "draft_window", "verify_inputs"]


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
    bonus: Tensor,
    suffix_lens: Tensor,
    suffix_predictions: Tensor,
    offsets: tuple[int, ...],
    block_size: int,
    mask_token_id: int,
    max_prefix: int | None = None,
) -> DraftWindow:
    """Lay out the baseline block and one shifted block per offset for each request.

    Parameters
    ----------
    prefix_lens : ``[bs]`` long, committed tokens ``s``.
    bonus : ``[bs]`` long, the bonus token at position ``s`` (block 0's anchor).
    suffix_lens : ``[bs]`` long, usable rejected-suffix length ``L`` (0 = none).
    suffix_predictions : ``[bs, X]`` long, target top-1 ``y[s+1..s+X]`` (``X = max(offsets)``).
    offsets : the shifted offsets ``d_r`` (sorted).
    block_size : ``B``.
    mask_token_id : the drafter's MASK token.
    max_prefix : ``max(s)`` from the host (``seq_lens_cpu``), so the mask needs no device read.

    >>> w = draft_window(torch.tensor([4]), torch.tensor([7]), torch.tensor([1]),
    ...                  torch.tensor([[8, 9]]), (1, 2), 2, 0)
    >>> w.input_ids.tolist(), w.positions.tolist(), w.row_valid.tolist()
    ([[7, 0, 8, 0, 0, 0]], [[4, 5, 5, 6, 6, 7]], [[True, False]])
    >>> w.query_columns.tolist(), w.seq_lens.tolist()
    ([[6, 7, 8, 9, 10, 11]], [6])
    """
    bs = prefix_lens.shape[0]
    dev = prefix_lens.device
    extra = max(offsets, default=0)
    if suffix_predictions.shape != (bs, extra):
        raise ValueError(f"suffix_predictions must be [bs, X={extra}], got {tuple(suffix_predictions.shape)}")
    s = prefix_lens.long()
    d = torch.tensor(offsets, dtype=torch.long, device=dev)  # [R]
    rows = 1 + d.numel()
    row_valid = d[None, :] <= suffix_lens.long()[:, None]  # [bs, R]
    shifted_anchor = (
        suffix_predictions.long().gather(1, (d - 1).expand(bs, -1)) if extra else suffix_predictions.long()
    )
    anchors = torch.cat([bonus.long()[:, None], torch.where(row_valid, shifted_anchor, mask_token_id)], 1)
    ids = torch.full((bs, rows, block_size), mask_token_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = anchors
    start = torch.cat([s[:, None], s[:, None] + d[None, :]], 1)  # [bs, 1+R]
    j = torch.arange(block_size, device=dev)
    positions = (start[:, :, None] + j).reshape(bs, rows * block_size)
    visible = torch.cat([torch.zeros(bs, 1, dtype=torch.long, device=dev), torch.where(row_valid, d, 0)], 1)
    # every request's own committed context goes in front (full_mask), so the blocks' mask is shared-free
    mask = full_mask(multi_anchor_mask(0, visible, extra, block_size), s, max_prefix=max_prefix)
    q = rows * block_size
    return DraftWindow(
        input_ids=ids.reshape(bs, q),
        positions=positions,
        extra_positions=s[:, None] + torch.arange(extra, device=dev),
        row_valid=row_valid,
        seq_lens=s + extra,
        custom_mask=mask,
        query_columns=s[:, None] + extra + torch.arange(q, device=dev),
        extra_columns=s[:, None] + torch.arange(extra, device=dev),
    )


def cap_tree(tree: DraftTree, caps: Tensor) -> DraftTree:
    """The first ``caps[b]`` nodes of request ``b``'s tree (``caps``: ``[bs]`` long), width cut to the largest.

    Nodes are numbered parents first, so a prefix of them is a subtree rooted at
    node 0: acceptance on it is still exact, it only offers fewer drafts. A shifted
    row none of whose nodes is kept is no longer attached (``row_sites`` -1).

    >>> tree = DraftTree.from_lists([[3, 7, 9, 4], [3, 5, 6, 8]], [[-1, 0, 0, 1], [-1, 0, 1, 2]])
    >>> t = cap_tree(tree, torch.tensor([3, 1]))
    >>> t.tokens.tolist(), t.parents.tolist(), t.num_nodes.tolist()
    ([[3, 7, 9], [3, 0, 0]], [[-1, 0, 0], [-1, -1, -1]], [3, 1])
    """
    caps = caps.to(tree.tokens.device).long()
    n = max(1, min(tree.width, int(caps.max())))
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
    )


@dataclass(frozen=True)
class VerifyInputs:
    """The target verify forward over a batch of trees, ``N`` nodes each (padded)."""

    tokens: Tensor  # [bs * N] long
    positions: Tensor  # [bs * N] long: s + depth
    custom_mask: Tensor  # [sum_b N * (s_b + N)] bool: FULL_MASK, True = attend
    columns: Tensor  # [bs, N] long: req_to_token columns s + i
    retrieve_index: Tensor  # [bs, N] long (SGLang's tree pointers, -1 = none)
    retrieve_next_token: Tensor  # [bs, N] long
    retrieve_next_sibling: Tensor  # [bs, N] long


def verify_inputs(tree: DraftTree, prefix_lens: Tensor, max_prefix: int | None = None) -> VerifyInputs:
    """FULL_MASK, positions and pointer arrays of ``tree`` after ``prefix_lens`` (``[bs]``;
    ``max_prefix``: its maximum from the host, if known).

    Padding nodes (past ``tree.num_nodes[b]``) attend to the prefix and themselves.

    >>> tree = DraftTree.from_lists([[3, 7, 9]], [[-1, 0, 0]])
    >>> v = verify_inputs(tree, torch.tensor([2]))
    >>> v.positions.tolist(), v.custom_mask.view(3, 5).int().tolist()
    ([2, 3, 3], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]])
    """
    bs, n = tree.tokens.shape
    s = prefix_lens.long().to(tree.tokens.device)
    index, next_token, next_sibling = tree.retrieve_arrays()
    return VerifyInputs(
        tokens=tree.tokens.reshape(-1),
        positions=tree.positions(s).reshape(-1),
        custom_mask=full_mask(tree.ancestor_mask(), s, max_prefix=max_prefix),
        columns=s[:, None] + torch.arange(n, device=s.device),
        retrieve_index=index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
    )


@dataclass(frozen=True)
class CommitPlan:
    """What one verify round keeps, in SGLang's batch-result layout.

    KV moves index the flattened ``[bs, N]`` verify window (``b * N + node``): the
    accepted node at depth ``k`` moves from window slot ``node`` to slot ``k``.
    """

    commit_lens: Tensor  # [bs] int32: accepted drafts + 1 (tokens committed this round)
    out_tokens: Tensor  # [bs, stride] long: accepted drafts then the bonus; 0 past commit_lens
    path_nodes: Tensor  # [bs, T] long: accepted node at each depth (0 past commit_lens)
    move_src: Tensor  # [M] long: flat window index of each moved node
    move_dst: Tensor  # [M] long: flat window index it moves to
    new_seq_lens: Tensor  # [bs] long: s + commit_lens


def commit_plan(tree: DraftTree, acc: Acceptance, prefix_lens: Tensor, stride: int) -> CommitPlan:
    """Tokens to emit and KV to keep after ``acc`` (``stride``: the output row width).

    >>> tree = DraftTree.from_lists([[3, 7, 8, 4, 9, 5, 6]], [[-1, 0, 1, 2, 1, 4, 5]])
    >>> from sglang_reanchor.verify import accept_tree
    >>> picks = torch.tensor([[7, 9, 1, 1, 5, 2, 1]])
    >>> p = commit_plan(tree, accept_tree(tree, picks, picks), torch.tensor([5]), stride=8)
    >>> p.out_tokens.tolist(), p.move_src.tolist(), p.move_dst.tolist(), p.new_seq_lens.tolist()
    ([[7, 9, 5, 2, 0, 0, 0, 0]], [4, 5], [2, 3], [9])
    """
    bs, width = tree.tokens.shape
    dev = tree.tokens.device
    t = acc.accept_lengths.long()
    # a device read, but the scheduler reads these lengths on the host right after anyway
    if int(t.max()) > stride:
        raise ValueError(f"an accepted path of {int(t.max())} tokens exceeds the output stride {stride}")
    nodes = acc.accepted_nodes  # [bs, T], -1 past t
    depth_idx = torch.arange(nodes.shape[1], device=dev)
    on_path = depth_idx[None, :] < t[:, None]
    safe = nodes.clamp(min=0)
    # out row: tokens at depths 1..t-1, then the bonus at index t-1
    drafted = tree.tokens.gather(1, safe)[:, 1:]  # [bs, T-1]
    out = torch.zeros(bs, stride, dtype=torch.long, device=dev)
    out[:, : drafted.shape[1]] = torch.where(on_path[:, 1:], drafted, 0)
    out.scatter_(1, (t - 1)[:, None], acc.bonus.long()[:, None])
    moving = on_path & (nodes != depth_idx[None, :])
    base = torch.arange(bs, device=dev)[:, None] * width
    return CommitPlan(
        commit_lens=t.to(torch.int32),
        out_tokens=out,
        path_nodes=torch.where(on_path, safe, 0),
        move_src=(base + safe)[moving],
        move_dst=(base + depth_idx[None, :])[moving],
        new_seq_lens=prefix_lens.long().to(dev) + t,
    )
