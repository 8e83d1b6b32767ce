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
>>> acc = accept_tree(tree, next_tokens, top1=next_tokens)
>>> acc.accepted_nodes.tolist(), acc.accept_lengths.tolist(), acc.bonus.tolist()
([[0, 1, 4, 5]], [4], [2])
>>> acc.suffix_nodes.tolist(), acc.suffix_tokens.tolist(), acc.suffix_predictions.tolist()
([[6]], [[6]], [[1]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .sampling import SamplingParams, sample_tokens
from .tree import DraftTree

__all__ = ["Acceptance", "accept_tree", "verify_tree"]


@dataclass(frozen=True)
class Acceptance:
    """Result of one verify round for a batch.

    ``accept_lengths`` counts the accepted drafts plus the bonus, as the paper's tau.
    """

    accept_lengths: Tensor  # [bs] long: accepted drafts + 1
    accepted_nodes: Tensor  # [bs, T] long: node ids root first; -1 past accept_lengths[b]
    bonus: Tensor  # [bs] long: the target's next token after the last accepted node
    next_tokens: Tensor  # [bs, N] long: the target's pick at every node (argmax or sample)
    suffix_nodes: Tensor  # [bs, S] long: rejected-suffix node ids, shallow first; -1 pad
    suffix_lengths: Tensor  # [bs] long
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
) -> Acceptance:
    """Accept from target ``logits`` (``[bs, N, V]``, row ``i`` = distribution after node ``i``)."""
    if logits.shape[:2] != tree.tokens.shape:
        raise ValueError(f"logits must be [bs, N, V] with [bs, N] = {tuple(tree.tokens.shape)}, got {tuple(logits.shape)}")
    top1 = logits.argmax(-1)
    next_tokens = top1 if params.greedy else sample_tokens(logits, params, generator)
    return accept_tree(tree, next_tokens, top1)


def accept_tree(tree: DraftTree, next_tokens: Tensor, top1: Tensor) -> Acceptance:
    """Accept given the target's pick at every node (``next_tokens``, ``top1``: ``[bs, N]`` long)."""
    bs = tree.batch_size
    dev = tree.tokens.device
    valid = tree.valid
    anc = tree.ancestor_mask()  # [bs, N, N]

    # A node "matches" if its token is what the target picked at its parent.
    parent_pick = next_tokens.gather(1, tree.parents.clamp(min=0))
    matches = (tree.parents < 0) | (tree.tokens == parent_pick)
    matches &= valid
    # Accepted = every node on the root path matches (siblings hold distinct tokens, so this is a path).
    accepted = valid & ~(anc & ~matches[:, None, :]).any(dim=2)
    last = torch.where(accepted, tree.depth, -1).argmax(dim=1)  # [bs] deepest accepted node
    accept_lengths = tree.depth.gather(1, last[:, None]).squeeze(1) + 1
    on_path = anc[torch.arange(bs, device=dev), last]  # [bs, N]: root..last
    accepted_nodes = _compact(on_path, int(accept_lengths.max()))
    bonus = next_tokens.gather(1, last[:, None]).squeeze(1)

    suffix = _rejected_suffix(tree, anc, last)
    suffix_lengths = suffix.sum(dim=1)
    suffix_nodes = _compact(suffix, int(suffix_lengths.max()))
    safe = suffix_nodes.clamp(min=0)
    pad = suffix_nodes < 0
    return Acceptance(
        accept_lengths=accept_lengths,
        accepted_nodes=accepted_nodes,
        bonus=bonus,
        next_tokens=next_tokens,
        suffix_nodes=suffix_nodes,
        suffix_lengths=suffix_lengths,
        suffix_tokens=tree.tokens.gather(1, safe).masked_fill(pad, 0),
        suffix_predictions=top1.gather(1, safe).masked_fill(pad, 0),
    )


def _rejected_suffix(tree: DraftTree, anc: Tensor, last: Tensor) -> Tensor:
    """``[bs, N]`` bool: nodes of the heavy path below ``last`` (``[bs]``).

    Each node's *heavy child* is its child with the deepest subtree, lowest id on
    ties. The suffix is every strict descendant of ``last`` reached through heavy
    children only.
    """
    bs, n = tree.tokens.shape
    dev = tree.tokens.device
    idx = torch.arange(n, device=dev)
    valid = tree.valid
    # Height of each node's subtree: deepest valid descendant's depth minus its own.
    desc_depth = torch.where(anc & valid[:, :, None], tree.depth[:, :, None], -1)  # [b, j, i]: j under i
    height = desc_depth.amax(dim=1) - tree.depth
    is_child = valid & (tree.parents >= 0)
    key = torch.where(is_child, height * (n + 1) + (n - idx), -1)
    best = torch.full((bs, n + 1), -1, dtype=torch.long, device=dev)
    best.scatter_reduce_(1, torch.where(is_child, tree.parents, n), key, reduce="amax")
    heavy = is_child & (key == best.gather(1, tree.parents.clamp(min=0)))

    rows = torch.arange(bs, device=dev)
    below = anc[rows, :, last] & (idx != last[:, None])  # strict descendants of last
    broken = (anc & (below & ~heavy)[:, None, :]).any(dim=2)  # path below last has a light node
    return below & ~broken


def _compact(mask: Tensor, width: int) -> Tensor:
    """Indices of the True entries of ``mask`` (``[bs, N]``), in order, padded with -1 to ``width``."""
    n = mask.shape[1]
    idx = torch.arange(n, device=mask.device)
    order = torch.where(mask, idx, n + idx).sort(dim=1).values[:, :width]
    return torch.where(order < n, order, -1)
