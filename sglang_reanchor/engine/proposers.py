"""Proposers: what turns a request's state and one drafter forward into a draft tree.

A `Proposer` is the engine's one seam for drafting methods: the loop
(`SpeculativeGenerator._speculate`) asks it for a tree each round and never asks
which method it is. Two ship here:

- `ChainProposer` (``"dflash"``): the baseline block alone, verified as a chain;
- `ReAnchorProposer` (``"reanchor"``): the baseline block plus one shifted block per
  offset, anchored behind the stored rejected suffix, and (``branch_width``) the drafter's
  runner-up tokens as branches, merged into one trie (`RoundCore`).

Both draft with the drafter's own head (`DFlashDrafter.head`: DFlash's argmax, or a
Domino / DSpark head's rollout), so every drafter family works with either. An analysis
that wants another tree subclasses one and overrides `tree`
(`sglang_reanchor.bench.analysis.DiagnosticProposer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from ..drafter import DFlashDrafter, DraftContextCache, DraftVocabHead, draft_hidden
from ..round import DraftAnchors, RoundCore
from ..suffix import SuffixBatch, SuffixStore
from ..tree import DraftTree

__all__ = ["ChainProposer", "Draft", "Drafting", "Proposer", "ReAnchorProposer"]


@dataclass(frozen=True)
class Draft:
    """One drafter forward's output for one request, before it becomes a tree."""

    blocks: Tensor  # [1, 1 + R, 1 + n] long: row 0 baseline, row r shifted (anchor a_d first); R fixed
    anchors: DraftAnchors  # the blocks' anchors; anchors.row_valid [1, R]: rows the suffix reaches
    suffix: SuffixBatch  # the rejected suffix the shifted rows drafted from (X entries)
    offsets: tuple[int, ...]  # [R]: d of each shifted row (the config's, valid or not)
    baseline_logits: Tensor | None = None  # [1, n, V']: the baseline's slot logits (branching only)
    draft_probs: Tensor | None = None  # [1, 1 + R, n]: the drafter's probability of each draft (verify_threshold)

    def valid_rows(self) -> tuple[Tensor, list[int], Tensor]:
        """``(blocks [1, 1 + R', 1 + n], offsets [R'], rejected_tokens [1, L])`` of the rows the
        suffix reached, and the suffix's tokens: a host read, for traces and analyses."""
        keep = [r for r, ok in enumerate(self.anchors.row_valid[0].tolist()) if ok]
        rows = torch.tensor([0] + [1 + r for r in keep], device=self.blocks.device)
        length = int(self.suffix.lengths[0])
        return self.blocks[:, rows], [self.offsets[r] for r in keep], self.suffix.tokens[:, :length]


@dataclass(frozen=True)
class Drafting:
    """What every proposer of one engine shares: the drafter and the pieces it borrows."""

    drafter: DFlashDrafter
    embed_tokens: nn.Module  # the target's input embedding
    head: nn.Module  # the target's LM head, or a `DraftVocabHead` of it
    core: RoundCore  # the round's device steps (anchors, tree, acceptance, commit)
    suffixes: SuffixStore  # rejected suffixes by request slot
    num_drafts: int  # drafts read per block (max_depth cuts it)
    num_slots: int | None  # query slots per block (None: the drafter's block size)

    def blocks(self, cache: DraftContextCache, anchors: DraftAnchors, suffix: SuffixBatch,
               with_logits: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One drafter forward over the anchors' blocks: ``[1, 1 + R, 1 + n]`` long, (``with_logits``)
        the scores the baseline block's drafts ``1 .. n`` were chosen from (``[1, n, V']``, for branching:
        DFlash's logits, a Domino / DSpark head's corrected ones along its rollout),
        and (with ``verify_threshold``) its probability of each draft (``[1, 1 + R, n]``)."""
        hidden = draft_hidden(self.drafter, cache, anchors.tokens, anchors.positions,
                              suffix.features if suffix.features.shape[1] else None, anchors.visible,
                              self.embed_tokens, num_slots=self.num_slots)  # [1, 1 + R, W, H]
        head, probs, logits = self.drafter.head, None, None
        with_probs = self.core.config.verify_threshold is not None
        emb, lm_head, n = self.embed_tokens, self.head, self.num_drafts
        if with_logits:  # the scores the baseline's drafts were chosen from (a family head's, along its rollout)
            drafts, probs, logits = head.rollout_with_scores(hidden, anchors.tokens, embed_tokens=emb, lm_head=lm_head,
                                                             num_drafts=n, with_probs=with_probs)
        elif with_probs:
            drafts, probs = head.rollout_with_probs(hidden, anchors.tokens, embed_tokens=emb, lm_head=lm_head,
                                                    num_drafts=n)
        else:
            drafts = head.rollout(hidden, anchors.tokens, embed_tokens=emb, lm_head=lm_head, num_drafts=n)
        return torch.cat([anchors.tokens[:, :, None], drafts], dim=-1), logits, probs

    @property
    def token_ids(self) -> Tensor | None:
        """The token of each logit column when drafting over a reduced vocabulary."""
        return cast(Tensor, self.head.token_ids) if isinstance(self.head, DraftVocabHead) else None


class Proposer(Protocol):
    """Drafts one round's tree for a request (batch 1: the reference engine)."""

    stores_suffix: bool  # whether rounds keep a rejected suffix for this proposer's next round
    uses_budget: bool  # whether its trees follow the round's node budget (a `BudgetPolicy` may choose it)

    def propose(self, cache: DraftContextCache, slot: int, seq_len: int, bonus: int, node_budget: int,
                generator: torch.Generator) -> tuple[DraftTree, Draft]:
        """The tree rooted at ``bonus`` (position ``seq_len``), at most ``node_budget`` nodes wide where
        the proposer branches, and the draft it came from. ``generator``: for random attachment."""
        ...


class ChainProposer:
    """DFlash: the baseline block, verified as a chain (``config.max_depth`` drafts deep at most, cut
    where the drafter's confidence runs out with ``config.verify_threshold``)."""

    stores_suffix = False
    uses_budget = False

    def __init__(self, drafting: Drafting) -> None:
        self.drafting = drafting

    def propose(self, cache: DraftContextCache, slot: int, seq_len: int, bonus: int, node_budget: int,
                generator: torch.Generator) -> tuple[DraftTree, Draft]:
        del slot, node_budget, generator  # a chain reads no suffix and is never cut
        dev = self.drafting.drafter.fc.weight.device
        prefix = torch.tensor([seq_len], device=dev)
        store = self.drafting.suffixes
        none = SuffixBatch(prefix * 0, store.tokens[:1, :0], store.predictions[:1, :0], store.features[:1, :0])
        anchors = DraftAnchors(torch.tensor([[bonus]], device=dev), prefix[:, None], prefix[:, None] * 0,
                               torch.zeros(1, 0, dtype=torch.bool, device=dev))
        blocks, _, probs = self.drafting.blocks(cache, anchors, none)
        draft = Draft(blocks, anchors, none, (), draft_probs=probs)
        if probs is None:
            return DraftTree.chain(blocks[:, 0]), draft
        return DraftTree.chain(blocks[:, 0], 1 + self.drafting.core.kept_drafts(probs)[:, 0]), draft


class ReAnchorProposer:
    """ReAnchor: the baseline block and one shifted block per offset, attached by the config's policy."""

    stores_suffix = True
    uses_budget = True

    def __init__(self, drafting: Drafting) -> None:
        self.drafting = drafting
        self.branching = drafting.core.config.branch_width > 0

    def propose(self, cache: DraftContextCache, slot: int, seq_len: int, bonus: int, node_budget: int,
                generator: torch.Generator) -> tuple[DraftTree, Draft]:
        d = self.drafting
        dev = d.drafter.fc.weight.device
        prefix = torch.tensor([seq_len], device=dev)
        suffix = d.suffixes.gather(torch.tensor([slot], device=dev), prefix)
        anchors = d.core.anchors(torch.tensor([bonus], device=dev), prefix, suffix,
                                 fill_token=d.drafter.mask_token_id)
        blocks, logits, probs = d.blocks(cache, anchors, suffix, with_logits=self.branching)
        draft = Draft(blocks, anchors, suffix, d.core.config.offsets, logits, probs)
        return self.tree(draft, node_budget, generator), draft

    def tree(self, draft: Draft, node_budget: int, generator: torch.Generator) -> DraftTree:
        """The trie of the baseline, the attached shifted rows and the branches (`RoundCore.tree`)."""
        return self.drafting.core.tree(draft.blocks, draft.anchors, draft.suffix, node_budget, generator=generator,
                                       baseline_logits=draft.baseline_logits, token_ids=self.drafting.token_ids,
                                       draft_probs=draft.draft_probs)
