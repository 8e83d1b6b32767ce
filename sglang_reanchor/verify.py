"""Tree acceptance: walk the draft tree with the target's choices, keep the rejected suffix.

The target scores every node once (one forward over the tree). At each node it
picks a *next token*: the argmax at T=0, a sample from its (temperature, top-k,
top-p) distribution at T>0. Acceptance starts at the root and moves to the
child whose token equals the current node's next token; it stops where no child
does, and that node's next token is the *bonus*. Drafts are deterministic, so
every emitted token is a draw from the target at the prefix it follows: the
output is exactly the target's, at any temperature (cf. Leviathan et al. 2023,
arXiv 2211.17192, with a point-mass draft).

The *rejected suffix* is the path of draft nodes below the last accepted node,
through the child with the deepest subtree (lowest node id on ties: the baseline
chain, then the earliest-attached row). It starts at the next bonus position.

>>> import torch
>>> from sglang_reanchor.tree import DraftTree
>>> tree = DraftTree.from_lists([[3, 7, 8, 4, 9, 5, 6]], [[-1, 0, 1, 2, 1, 4, 5]])
>>> next_tokens = torch.tensor([[7, 9, 1, 1, 5, 2, 1]])  # the target's pick after each node
>>> acc = accept_tree(tree, next_tokens, top1=next_tokens, path_width=5, suffix_width=2)
>>> acc.accepted_nodes.tolist(), acc.accept_lengths.tolist(), acc.bonus.tolist()
([[0, 1, 4, 5, -1]], [4], [2])
>>> acc.suffix_nodes.tolist(), acc.suffix_tokens.tolist(), acc.suffix_predictions.tolist()
([[6, -1]], [[6, 0]], [[1, 0]])

Every width is a host number (``path_width``, ``suffix_width``): nothing here reads
the device, so a round's shapes are known before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .sampling import SamplingParams, sample_tokens
from .indices import arange
from .tree import DraftTree

__all__ = ["Acceptance", "accept_tree", "verify_tree"]


@dataclass(frozen=True)
class Acceptance:
    """Result of one verify round for a batch.

    ``accept_lengths`` counts the accepted drafts plus the bonus, as the paper's tau.
    """

    accept_lengths: Tensor  # [bs] long: accepted drafts + 1
    accepted_nodes: Tensor  # [bs, T] long: node id at each depth, root first; -1 past accept_lengths[b]
    bonus: Tensor  # [bs] long: the target's next token after the last accepted node
    next_tokens: Tensor  # [bs, N] long: the target's pick at every node (argmax or sample)
    suffix_nodes: Tensor  # [bs, S] long: rejected-suffix node ids, shallow first; -1 pad
    suffix_lengths: Tensor  # [bs] long: real entries of suffix_nodes (<= S)
    suffix_tokens: Tensor  # [bs, S] long: their draft tokens r (pad 0)
    suffix_predictions: Tensor  # [bs, S] long: target top-1 at each, i.e. y[s+1..s+L] (pad 0)

    def new_tokens(self, tree: DraftTree) -> list[list[int]]:
        """Tokens committed this round per request: accepted drafts, then the bonus."""
        out = []
        for b in range(tree.batch_size):
            n = int(self.accept_lengths[b])
            nodes = self.accepted_nodes[b, 1:n]
            out.append(tree.tokens[b, nodes].tolist() + [int(self.bonus[b])])
        return out


def verify_tree(
    tree: DraftTree,
    logits: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    path_width: int | None = None,
    suffix_width: int | None = None,
) -> Acceptance:
    """Accept from target ``logits`` (``[bs, N, V]``, row ``i`` = distribution after node ``i``)."""
    if logits.shape[:2] != tree.tokens.shape:
        raise ValueError(f"logits must be [bs, N, V] with [bs, N] = {tuple(tree.tokens.shape)}, got {tuple(logits.shape)}")
    top1 = logits.argmax(-1)
    next_tokens = top1 if params.greedy else sample_tokens(logits, params, generator)
    return accept_tree(tree, next_tokens, top1, path_width, suffix_width)


def accept_tree(tree: DraftTree, next_tokens: Tensor, top1: Tensor, path_width: int | None = None,
                suffix_width: int | None = None) -> Acceptance:
    """Accept given the target's pick at every node (``next_tokens``, ``top1``: ``[bs, N]`` long).

    Output widths are host numbers, never read from the device: ``accepted_nodes`` has
    ``path_width`` columns (default ``N``; at least the deepest node's depth + 1, e.g.
    ``max_depth + 1``), the suffix ``suffix_width`` (default ``N - 1``; a longer suffix
    is cut to it, as the suffix store would).
    """
    bs, n = tree.tokens.shape
    if next_tokens.shape != tree.tokens.shape or top1.shape != tree.tokens.shape:
        raise ValueError(f"next_tokens and top1 must be [bs, N] = {tuple(tree.tokens.shape)} (a pick at every "
                         f"node, padding included); got {tuple(next_tokens.shape)} and {tuple(top1.shape)}")
    dev = tree.tokens.device
    path_width = n if path_width is None else path_width
    suffix_width = n - 1 if suffix_width is None else suffix_width
    idx = arange(n, dev)
    is_child = tree.parents >= 0  # [bs, N]: real nodes but the root (padding has parent -1)
    padding = idx >= tree.num_nodes[:, None]

    # A node matches if its token is what the target picked at its parent; it is accepted if
    # every node of its root path matches. Siblings hold distinct tokens, so at most one child
    # of a node matches: the accepted nodes are one root path.
    parent_pick = next_tokens.gather(1, tree.parents.clamp(min=0))
    mismatch = (tree.tokens != parent_pick) & is_child | padding
    rejected = (tree.ancestors & mismatch[:, None, :]).any(dim=2)  # [bs, N]: a mismatch on the root path
    last = torch.where(rejected, -1, tree.depth).argmax(dim=1, keepdim=True)  # [bs, 1]: the deepest accepted
    accept_lengths = tree.depth.gather(1, last).squeeze(1) + 1
    bonus = next_tokens.gather(1, last).squeeze(1)

    suffix_nodes, real = _heavy_path(tree, is_child, idx, last, suffix_width)  # [bs, S] each
    # the suffix's draft tokens and the target's top-1 at each, in one gather
    safe = suffix_nodes.clamp(min=0)[:, None, :].expand(bs, 2, -1)
    at_suffix = torch.where(real[:, None, :], torch.stack([tree.tokens, top1], dim=1).gather(2, safe), 0)
    return Acceptance(
        accept_lengths=accept_lengths,
        accepted_nodes=_by_depth(~rejected, tree.depth, path_width),
        bonus=bonus,
        next_tokens=next_tokens,
        suffix_nodes=suffix_nodes,
        suffix_lengths=real.sum(dim=1),
        suffix_tokens=at_suffix[:, 0],
        suffix_predictions=at_suffix[:, 1],
    )


def _heavy_path(tree: DraftTree, is_child: Tensor, idx: Tensor, last: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The first ``width`` nodes of the heavy path below ``last`` (``[bs, 1]``): ``(nodes, real)``,
    ``[bs, width]`` long (-1 pad) and bool (not padding).

    Each node's *heavy child* is its child with the deepest subtree, lowest id on
    ties; the path steps from ``last`` to its heavy child ``width`` times (a fixed
    number of gathers: the suffix store keeps ``X = max(offsets)`` entries).
    """
    bs, n = tree.tokens.shape
    # height of each node's subtree: its deepest descendant's depth minus its own
    height = torch.where(tree.ancestors, tree.depth[:, :, None], 0).amax(dim=1) - tree.depth
    key = torch.where(is_child, height * (n + 1) + (n - idx), -1)  # higher is better; ids break ties low
    best = torch.full((bs, n + 1), -1, dtype=torch.long, device=idx.device)
    best.scatter_reduce_(1, torch.where(is_child, tree.parents, n), key, reduce="amax")
    heavy_child = torch.where(best >= 0, n - best % (n + 1), n)  # [bs, N+1]; n = none (and the spare column)
    steps = []
    node = last
    for _ in range(width):  # X <= a few steps of pointer chasing, each one gather
        node = heavy_child.gather(1, node)
        steps.append(node)
    path = torch.cat(steps, dim=1) if steps else last[:, :0]
    real = path < n
    return torch.where(real, path, -1), real


def _by_depth(nodes: Tensor, column: Tensor, width: int) -> Tensor:
    """Node ids of a path laid out by depth: ``out[b, column[b, i]] = i`` for each ``nodes[b, i]``.

    ``nodes``: ``[bs, N]`` bool, at most one per column (a root path); ``column``: ``[bs, N]``
    long, ``>= 0``. Columns past ``width`` are dropped; empty ones are -1.

    >>> _by_depth(torch.tensor([[True, False, True, True]]), torch.tensor([[0, 1, 1, 2]]), 4).tolist()
    [[0, 2, 3, -1]]
    """
    bs, n = nodes.shape
    out = torch.full((bs, width + 1), -1, dtype=torch.long, device=nodes.device)
    ids = arange(n, nodes.device).expand(bs, n)
    return out.scatter_(1, torch.where(nodes, column.clamp(max=width), width), ids)[:, :width]
