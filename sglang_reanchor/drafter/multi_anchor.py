"""Multi-anchor drafting: R DFlash blocks in one drafter forward (ReAnchor's draft step).

Block ``r`` of batch row ``b`` is ``[anchors[b, r], MASK x (B-1)]`` at positions
``anchor_positions[b, r] + 0..B-1``. It sees

1. all committed context in the `DraftContextCache` (positions ``0..C-1``, K/V shared
   by every block, computed once per committed row),
2. the first ``extra_visible[b, r]`` rows of per-call extra context (row ``i`` at
   position ``C + i``; ReAnchor: the rejected suffix's verifier features),
3. its own block, bidirectionally; never another block.

That is exactly R independent plain DFlash forwards (z-lab ``DFlashDraftModel``), each
with its own context, packed into one call. Row 0 of ReAnchor (``extra_visible = 0``,
anchor = bonus token at position ``C``) is plain DFlash.

All batch rows of one call share the committed context length ``C``: the reference
engine drafts one request at a time (its rows are one request's anchors); SGLang
batches requests through its own paged KV pool instead of this module.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.masks import multi_anchor_mask  # the one multi-anchor mask (re-exported here)

from .context import DraftContextCache
from .model import DFlashDrafter

__all__ = ["draft_blocks", "draft_hidden", "multi_anchor_mask"]


def draft_hidden(drafter: DFlashDrafter, cache: DraftContextCache, anchors: Tensor,
                 anchor_positions: Tensor, extra_features: Tensor | None, extra_visible: Tensor,
                 embed_tokens: nn.Module, num_slots: int | None = None) -> Tensor:
    """Drafter hidden states of R blocks in one forward (see the module docstring).

    Parameters
    ----------
    drafter : DFlashDrafter
    cache : DraftContextCache
        Committed context K/V (positions ``0..C-1``), batch 1 or ``bs``.
    anchors : Tensor
        ``[bs, R]`` long, block anchor tokens.
    anchor_positions : Tensor
        ``[bs, R]`` long, absolute position of each anchor.
    extra_features : Tensor or None
        ``[bs, X, K*H]`` target features of the extra context rows (positions
        ``C..C+X-1``); None means ``X = 0``.
    extra_visible : Tensor
        ``[bs, R]`` long in ``[0, X]``: block r sees extra rows ``0..extra_visible-1``.
    embed_tokens : nn.Module
        The target's input embedding (``ids [..] -> [.., H]``).
    num_slots : int or None
        Query slots ``W`` per block, anchor included: ``[anchor, MASK x (W-1)]``. None
        means ``W = B``, z-lab's DFlash. A shorter block is a cheaper forward, but its
        slots no longer see the masks past ``W``, so its drafts differ from the trained
        block's.

    Returns
    -------
    Tensor
        ``[bs, R, W, H]`` hidden states after the drafter's final norm.
    """
    if anchors.dtype != torch.long or anchors.dim() != 2:
        raise ValueError(f"anchors must be long [bs, R], got {anchors.dtype} {tuple(anchors.shape)}")
    bs, num_blocks = anchors.shape
    for name, t in (("anchor_positions", anchor_positions), ("extra_visible", extra_visible)):
        if t.shape != anchors.shape or t.dtype != torch.long:
            raise ValueError(f"{name} must be long [bs, R] = {(bs, num_blocks)}, "
                             f"got {t.dtype} {tuple(t.shape)}")
    num_extra = 0 if extra_features is None else extra_features.shape[1]
    if extra_features is not None and extra_features.shape[0] != bs:
        raise ValueError(f"extra_features must be [bs={bs}, X, K*H], got {tuple(extra_features.shape)}")
    if bool((extra_visible < 0).any() or (extra_visible > num_extra).any()):
        raise ValueError(f"extra_visible must be in [0, X={num_extra}], got {extra_visible.tolist()}")
    width, c_len = _slots(drafter, num_slots), cache.length

    # queries: [anchor, MASK x (W-1)] per block, block-major
    ids = torch.full((bs, num_blocks, width), drafter.mask_token_id, dtype=torch.long,
                     device=anchors.device)
    ids[:, :, 0] = anchors
    offsets = torch.arange(width, device=anchors.device)
    positions = (anchor_positions[:, :, None] + offsets).reshape(bs, num_blocks * width)
    embeds = embed_tokens(ids.reshape(bs, num_blocks * width))

    context = cache.kv
    if num_extra:
        assert extra_features is not None
        extra_pos = (c_len + torch.arange(num_extra, device=anchors.device)).expand(bs, -1)
        extra = drafter.project_context(extra_features, extra_pos)
        context = extra if context is None else context.cat(extra)
    mask = multi_anchor_mask(c_len, extra_visible, num_extra, width)
    hidden = drafter(embeds, positions, context, mask)  # [bs, R*W, H]
    return hidden.view(bs, num_blocks, width, -1)


def draft_blocks(drafter: DFlashDrafter, cache: DraftContextCache, anchors: Tensor,
                 anchor_positions: Tensor, extra_features: Tensor | None, extra_visible: Tensor,
                 embed_tokens: nn.Module, lm_head: nn.Module, num_drafts: int | None = None,
                 num_slots: int | None = None) -> Tensor:
    """Greedy drafts of R blocks in one drafter forward.

    Arguments as `draft_hidden`, plus ``lm_head``: the target's output head
    (``[.., H] -> [.., V]``), or a `DraftVocabHead` of it (drafts from its tokens only),
    and ``num_drafts``: how many drafts ``n`` to read per block (None: all ``W - 1``).
    The LM head skips the slots past them; the drafter still runs over all ``W``
    slots, so the first ``n`` drafts do not depend on ``num_drafts``.

    The drafts are the drafter's head's rollout of each block from its own anchor
    (``drafter.head.rollout``, `heads.py`): DFlash's argmax per slot, Domino's GRU
    correction, DSpark's Markov head; every block of every row at once.

    Returns
    -------
    Tensor
        ``[bs, R, 1 + n]`` long: ``[:, r, 0]`` is the anchor, ``[:, r, 1:]`` the greedy
        drafts for positions ``anchor_positions[:, r] + 1 .. + n``.
    """
    width = _slots(drafter, num_slots)
    n = width - 1 if num_drafts is None else num_drafts
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= width - 1:
        raise ValueError(f"num_drafts must be None or an int in [1, {width - 1}] (query slots - 1), got {num_drafts!r}")
    hidden = draft_hidden(drafter, cache, anchors, anchor_positions, extra_features,
                          extra_visible, embed_tokens, num_slots=width)  # [bs, R, W, H]
    drafts = drafter.head.rollout(hidden, anchors, embed_tokens=embed_tokens, lm_head=lm_head,
                                  num_drafts=n)  # [bs, R, n]
    return torch.cat([anchors[:, :, None], drafts], dim=-1)


def _slots(drafter: DFlashDrafter, num_slots: int | None) -> int:
    """Query slots per block: ``num_slots`` checked, or the drafter's ``block_size``."""
    block = drafter.block_size
    if num_slots is None:
        return block
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or not 2 <= num_slots <= block:
        raise ValueError(f"num_slots must be None or an int in [2, {block}] (the drafter's block_size), "
                         f"got {num_slots!r}")
    return num_slots
