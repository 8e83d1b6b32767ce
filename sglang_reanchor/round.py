"""The round core: the device part of one ReAnchor round, with every shape fixed on the host.

One round, for a batch of ``bs`` requests (the reference engine and SGLang's worker
both run exactly these steps; only the two model forwards differ)::

    suffix   = store.gather(slots, prefix_lens)             SuffixBatch      (suffix.py)
    anchors  = core.anchors(bonus, prefix_lens, suffix)      DraftAnchors
    blocks   = <drafter forward over the 1 + R blocks>       [bs, 1+R, W]
    tree     = core.tree(blocks, anchors, suffix, budget)    DraftTree        (tree.py)
    logits   = <target forward over the tree's N nodes>      [bs, N, V]
    acc      = core.accept(tree, picks, top1)                Acceptance       (verify.py)
    plan     = core.commit(tree, acc, prefix_lens)           CommitPlan
    store.put(slots, *core.next_suffix(acc, plan, features))

Host numbers are fixed when the core is built (``R``, ``W = 1 + drafts``, the output
stride ``T``) or per round from the host (the node budget, hence ``N``). Nothing in
these steps reads a device value back (`tests/test_round_syncs.py` runs them under
`sglang_reanchor.audit.SyncDetector` and under ``torch.compile`` with recompiles
forbidden), so the whole round can sit in a CUDA graph or run one step ahead of the
host under an overlap scheduler.

Worked example of a commit (``s = 5``; path root 0 -> node 1 -> node 4 -> node 5)::

    accepted_nodes [0, 1, 4, 5]  ->  KV moves  window slot 4 -> 2, 5 -> 3 (0 -> 0, 1 -> 1: identity)
    commit_lens 4, new seq_len 9;  out_tokens = tokens[1], tokens[4], tokens[5], bonus
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .branching import branch_candidates, branch_rows
from .config import ReAnchorConfig
from .indices import arange
from .suffix import SuffixBatch
from .tree import DraftTree, build_draft_tree
from .verify import Acceptance, accept_tree

__all__ = ["CommitPlan", "DraftAnchors", "RoundCore", "commit_plan", "draft_anchors"]


@dataclass(frozen=True)
class DraftAnchors:
    """Where the 1 + R blocks of each request are anchored (the drafter's inputs)."""

    tokens: Tensor  # [bs, 1+R] long: row 0 the bonus; row r the target's top-1 y[s+d_r] (fill if not valid)
    positions: Tensor  # [bs, 1+R] long: s, then s + d_r
    visible: Tensor  # [bs, 1+R] long: rejected-suffix feature rows each block sees: 0, then d_r (0 if not valid)
    row_valid: Tensor  # [bs, R] bool: the stored suffix reaches d_r


def draft_anchors(bonus: Tensor, prefix_lens: Tensor, suffix: SuffixBatch, offsets: Tensor,
                  fill_token: int) -> DraftAnchors:
    """Anchor the baseline block at the bonus and shifted block ``r`` at ``y[s + d_r]``.

    ``bonus``, ``prefix_lens``: ``[bs]`` long; ``offsets``: ``[R]`` long on the device;
    ``fill_token``: the anchor of a row that is not valid (the drafter's mask token).

    >>> from sglang_reanchor.suffix import SuffixBatch
    >>> sfx = SuffixBatch(torch.tensor([1]), torch.tensor([[4, 4]]), torch.tensor([[8, 9]]), torch.zeros(1, 2, 3))
    >>> a = draft_anchors(torch.tensor([7]), torch.tensor([4]), sfx, torch.tensor([1, 2]), fill_token=0)
    >>> a.tokens.tolist(), a.positions.tolist(), a.visible.tolist(), a.row_valid.tolist()
    ([[7, 8, 0]], [[4, 5, 6]], [[0, 1, 0]], [[True, False]])
    """
    bs, rows = bonus.shape[0], offsets.shape[0]
    s = prefix_lens.long()
    row_valid = offsets[None, :] <= suffix.lengths[:, None]  # [bs, R]
    if rows:
        shifted = suffix.predictions.gather(1, (offsets - 1).expand(bs, rows))
    else:
        shifted = suffix.predictions[:, :0]
    tokens = torch.cat([bonus.long()[:, None], torch.where(row_valid, shifted, fill_token)], dim=1)
    positions = torch.cat([s[:, None], s[:, None] + offsets[None, :]], dim=1)
    visible = torch.nn.functional.pad(torch.where(row_valid, offsets[None, :], 0), (1, 0))
    return DraftAnchors(tokens=tokens, positions=positions, visible=visible, row_valid=row_valid)


@dataclass(frozen=True)
class CommitPlan:
    """What one verify round keeps, laid out for a batch (every width a host number).

    KV moves index the flattened ``[bs, N]`` verify window (``b * N + node``): the
    accepted node at depth ``k`` moves from window slot ``node`` to slot ``k``. There
    are always ``bs * T`` moves; those at depths that need none, or past the
    accepted path, are identity moves (``src == dst``), so the list never depends
    on the data. Applied as one gather then one scatter, they never clash: each
    destination is written once, and an identity move's slot is nobody's
    destination.
    """

    commit_lens: Tensor  # [bs] long: accepted drafts + 1 (tokens committed this round)
    out_tokens: Tensor  # [bs, stride] long: accepted drafts then the bonus; 0 past commit_lens
    path_nodes: Tensor  # [bs, T] long: accepted node at each depth (0 past commit_lens)
    move_src: Tensor  # [bs * T] long: flat window index each kept node is read from
    move_dst: Tensor  # [bs * T] long: flat window index it is written to
    new_seq_lens: Tensor  # [bs] long: s + commit_lens


def commit_plan(tree: DraftTree, acc: Acceptance, prefix_lens: Tensor, stride: int) -> CommitPlan:
    """Tokens to emit and KV to keep after ``acc`` (``stride`` >= the path width ``T``).

    >>> tree = DraftTree.from_lists([[3, 7, 8, 4, 9, 5, 6]], [[-1, 0, 1, 2, 1, 4, 5]])
    >>> picks = torch.tensor([[7, 9, 1, 1, 5, 2, 1]])
    >>> p = commit_plan(tree, accept_tree(tree, picks, picks, path_width=5), torch.tensor([5]), stride=6)
    >>> p.out_tokens.tolist(), p.path_nodes.tolist(), p.new_seq_lens.tolist()
    ([[7, 9, 5, 2, 0, 0]], [[0, 1, 4, 5, 0]], [9])
    >>> p.move_src.tolist(), p.move_dst.tolist()
    ([0, 1, 4, 5, 4], [0, 1, 2, 3, 4])
    """
    bs, width = tree.tokens.shape
    dev = tree.tokens.device
    nodes = acc.accepted_nodes  # [bs, T], -1 past the path
    depths = nodes.shape[1]
    if depths > stride:
        raise ValueError(f"the accepted path has {depths} columns, more than the output stride {stride}")
    t = acc.accept_lengths.long()
    on_path = nodes >= 0
    safe = nodes.clamp(min=0)  # 0 past the path
    k = arange(depths, dev)
    # out row: the drafts at depths 1..t-1, then the bonus at t-1
    drafted = torch.where(on_path[:, 1:], tree.tokens.gather(1, safe[:, 1:]), 0)  # [bs, T-1]
    out = torch.nn.functional.pad(drafted, (0, stride - depths + 1))  # [bs, stride]
    out.scatter_(1, (t - 1)[:, None], acc.bonus.long()[:, None])
    base = arange(bs, dev)[:, None] * width
    return CommitPlan(
        commit_lens=t,
        out_tokens=out,
        path_nodes=safe,
        move_src=(base + torch.where(on_path, safe, k)).reshape(-1),
        move_dst=(base + k).expand(bs, depths).reshape(-1),
        new_seq_lens=prefix_lens.long() + t,
    )


class RoundCore:
    """The round's device steps for one configuration (module docstring).

    Parameters
    ----------
    config : ReAnchorConfig
        Offsets, attachment policy, region and depth cap; ``node_budget`` is the
        default budget of `tree`.
    num_drafts : int
        Drafts read per block (``W = 1 + num_drafts`` tokens a block).
    device : torch.device
        Where the offsets live (one host-to-device copy, here, not per round).
    max_nodes : int, optional
        The largest node budget any round will use (SGLang: ``node_budget``); None
        when budgets are chosen freely (the engine's `BudgetPolicy`).
    generator : torch.Generator, optional
        CPU generator behind ``policy="random"`` (an eager-only ablation).

    ``stride``, the output row width, is the longest path a round can commit
    (`min_stride`): fixed for the core, whatever each round accepts.
    """

    def __init__(self, config: ReAnchorConfig, num_drafts: int, device: torch.device | str,
                 max_nodes: int | None = None, generator: torch.Generator | None = None) -> None:
        self.config = config
        self.num_drafts = num_drafts
        self.stride = self.min_stride(config, num_drafts, max_nodes)
        self.offsets = torch.tensor(config.offsets, dtype=torch.long, device=device)  # [R], once
        self.generator = generator

    @staticmethod
    def min_stride(config: ReAnchorConfig, num_drafts: int, max_nodes: int | None = None) -> int:
        """Tokens on the longest possible root path: the chain's ``1 + n``, or ``2 + 2n`` with
        shifted rows (a row may hang below the chain's last node), cut by ``max_depth`` and by
        ``max_nodes`` (a path of ``k`` tokens needs ``k`` nodes).

        >>> RoundCore.min_stride(ReAnchorConfig(), 15), RoundCore.min_stride(ReAnchorConfig(offsets=()), 15)
        (32, 16)
        >>> RoundCore.min_stride(ReAnchorConfig(max_depth=4), 4, max_nodes=3)
        3
        """
        deepest = num_drafts if not config.offsets else 2 * num_drafts + 1
        if config.max_depth is not None:
            deepest = min(deepest, config.max_depth)
        return min(deepest + 1, max_nodes if max_nodes is not None else deepest + 1)

    @property
    def num_rows(self) -> int:
        """Rows of the grid a tree is merged on: the baseline, the shifted rows, the branches."""
        config = self.config
        return 1 + len(config.offsets) + branch_rows(config, self.num_drafts)

    def width(self, node_budget: int | None = None) -> int:
        """``N``: the tree width for a budget (a host number)."""
        budget = self.config.node_budget if node_budget is None else node_budget
        return min(budget, self.num_rows * (1 + self.num_drafts))

    def anchors(self, bonus: Tensor, prefix_lens: Tensor, suffix: SuffixBatch, fill_token: int) -> DraftAnchors:
        """Block anchors (`draft_anchors`)."""
        return draft_anchors(bonus, prefix_lens, suffix, self.offsets, fill_token)

    def kept_drafts(self, draft_probs: Tensor) -> Tensor:
        """Drafts each row keeps under ``config.verify_threshold``: ``draft_probs [bs, 1+R, n]``
        (the drafter's probability of each draft) -> ``[bs, 1+R]`` long, the leading drafts whose
        running product of probabilities stays at or above the threshold; the baseline keeps one
        at least (a round verifies a draft), a shifted row may keep none (its anchor stays)."""
        threshold = self.config.verify_threshold
        if threshold is None:
            raise ValueError("kept_drafts needs ReAnchorConfig.verify_threshold")
        kept = (draft_probs.float().cumprod(dim=-1) >= threshold).sum(dim=-1)  # the product only falls
        return torch.cat([kept[:, :1].clamp(min=1), kept[:, 1:]], dim=1)

    def tree(self, blocks: Tensor, anchors: DraftAnchors, suffix: SuffixBatch,
             node_budget: int | None = None, generator: torch.Generator | None = None,
             baseline_logits: Tensor | None = None, token_ids: Tensor | None = None,
             draft_probs: Tensor | None = None) -> DraftTree:
        """The draft tree of ``blocks`` (``[bs, 1+R, W]``: row 0 the baseline block), ``width(node_budget)``
        wide (``generator``: overrides the core's, for ``policy="random"``).

        With ``config.branch_width``, ``baseline_logits`` (``[bs, n, V']``: the drafter's logits at
        the baseline's slots ``1 .. n``; ``token_ids`` ``[V']`` when over a reduced vocabulary)
        give the branches (`sglang_reanchor.branching`). With ``config.verify_threshold``,
        ``draft_probs`` (``[bs, 1+R, W-1]``) cut the rows (`kept_drafts`).
        """
        config = self.config
        if node_budget is not None and node_budget != config.node_budget:
            config = config.replace(node_budget=node_budget)
        branches = None
        if config.branch_width:
            if baseline_logits is None:
                raise ValueError("ReAnchorConfig.branch_width needs the baseline block's logits (baseline_logits)")
            branches = branch_candidates(blocks[:, 0], baseline_logits, config, token_ids)
        row_drafts = None
        if config.verify_threshold is not None:
            if draft_probs is None:
                raise ValueError("ReAnchorConfig.verify_threshold needs the drafts' probabilities (draft_probs)")
            row_drafts = self.kept_drafts(draft_probs)
        return build_draft_tree(blocks[:, 0], blocks[:, 1:], self.offsets, anchors.row_valid, suffix.tokens,
                                config, generator=generator or self.generator, branches=branches,
                                row_drafts=row_drafts)

    def accept(self, tree: DraftTree, next_tokens: Tensor, top1: Tensor) -> Acceptance:
        """Acceptance with the target's picks (``[bs, N]``), path ``min(stride, N)`` wide, suffix ``X``."""
        return accept_tree(tree, next_tokens, top1, path_width=min(self.stride, tree.width),
                           suffix_width=self.config.max_offset)

    def commit(self, tree: DraftTree, acc: Acceptance, prefix_lens: Tensor) -> CommitPlan:
        return commit_plan(tree, acc, prefix_lens, self.stride)

    @staticmethod
    def next_suffix(acc: Acceptance, plan: CommitPlan, features: Tensor) -> tuple[Tensor, ...]:
        """``(starts, lengths, tokens, predictions, features)`` for `SuffixStore.put`.

        ``features``: ``[bs, N, D]``, the target's features at every verified node.
        """
        nodes = acc.suffix_nodes.clamp(min=0)
        feats = features.gather(1, nodes[:, :, None].expand(-1, -1, features.shape[-1]))
        return plan.new_seq_lens, acc.suffix_lengths, acc.suffix_tokens, acc.suffix_predictions, feats
