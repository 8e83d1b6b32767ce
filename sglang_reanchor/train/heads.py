"""Training a DSpark Markov head on a frozen DFlash backbone (issue: drafters for the CPU pair).

A block drafter drafts every slot of a block at once, so slot ``k`` cannot see what
slot ``k-1`` drafted. DSpark's Markov head adds that dependence as a bias on the base
logits (`drafter.dspark`): ``bias = markov_w2(f(markov_w1[prev], h_k, state))``, ``prev``
the token drafted at the slot before. It is small (``2 V r`` parameters and, for the
``gated`` / ``rnn`` kinds, one projection), so it trains quickly on a backbone that is
already trained and kept frozen.

`with_dspark_head` turns a DFlash drafter into a DSpark one with the same backbone, in
DFlash's query layout (``sample_from_anchor = False``: ``gamma = B - 1`` drafts per
block, slot ``k`` predicts ``x[a + k]``, as the backbone was trained), and a Markov head
whose bias starts at exactly zero (``markov_w2 = 0``): before its first step it drafts
the backbone's tokens. `markov_bias` is the head teacher-forced: ``prev`` at slot ``k``
is the true token ``x[a + k - 1]`` (the anchor at slot 1). That is exact for what
decoding measures: a draft only counts while every earlier draft was right, and then
the drafted ``prev`` *is* the true one.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..drafter import DFlashDrafter
from ..drafter.dspark import MARKOV_HEAD_TYPES, DSparkDrafter, DSparkSettings, MarkovHead
from .loss import IGNORE

__all__ = ["head_parameters", "markov_bias", "teacher_forced_prev", "with_dspark_head"]


def with_dspark_head(drafter: DFlashDrafter, markov_rank: int, markov_head_type: str = "gated",
                     seed: int = 0) -> DSparkDrafter:
    """A DSpark drafter with ``drafter``'s backbone (and draft vocabulary) and a new Markov head
    (``markov_w1 ~ N(0, initializer_range)``, ``markov_w2 = 0``, the projections' default init):
    its drafts equal ``drafter``'s until the head is trained. No confidence head."""
    if type(drafter) is not DFlashDrafter:
        raise ValueError(f"with_dspark_head takes a DFlash drafter (its backbone), got a {drafter.family_name} one")
    if markov_head_type not in MARKOV_HEAD_TYPES:
        raise ValueError(f"markov_head_type must be one of {MARKOV_HEAD_TYPES}, got {markov_head_type!r}")
    config = drafter.config
    settings = DSparkSettings(markov_rank=markov_rank, markov_head_type=markov_head_type,
                              sample_from_anchor=False, confidence_head=False)
    dtype = drafter.fc.weight.dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dspark = DSparkDrafter(dataclasses.replace(config, block_size=config.block_size - 1), settings)
    dspark = dspark.to(device=drafter.fc.weight.device, dtype=dtype)
    missing, unexpected = dspark.load_state_dict(drafter.state_dict(), strict=False)
    if unexpected or any(not k.startswith("markov_head.") for k in missing):
        raise AssertionError(f"backbone copy: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        dspark.markov_head.markov_w2.weight.zero_()
    dspark.vocab_ranking = drafter.vocab_ranking
    assert dspark.block_size == drafter.block_size
    return dspark.train(drafter.training)


def head_parameters(drafter: DFlashDrafter) -> list[torch.nn.Parameter]:
    """The parameters of a family drafter's head (what a head-only run trains): DSpark's Markov
    head; raises for a drafter without one."""
    if not isinstance(drafter, DSparkDrafter):
        raise ValueError(f"a head-only run trains a DSpark drafter's Markov head; this is a {drafter.family_name} "
                         "drafter (make one with `train add-head`)")
    return list(drafter.markov_head.parameters())


def teacher_forced_prev(anchor_tokens: Tensor, labels: Tensor) -> Tensor:
    """The token before each proposal slot: ``[anchor, label_1 .. label_{n-1}]`` per block.

    ``anchor_tokens [bs, N]``, ``labels [bs, N, n]`` (`loss.block_labels`; `IGNORE` past the
    sequence end, which no scored slot reads) -> ``[bs, N, n]`` long.
    """
    prev = torch.cat([anchor_tokens[..., None], labels[..., :-1]], dim=-1)
    return torch.where(prev == IGNORE, torch.zeros_like(prev), prev)


def markov_bias(head: MarkovHead, slots: Tensor, prev: Tensor, w2: Tensor) -> Tensor:
    """The Markov bias of every proposal slot, teacher-forced.

    ``slots [R, n, H]`` (the blocks' proposal-slot hidden states), ``prev [R, n]`` long
    (`teacher_forced_prev`), ``w2 [V', r]`` (the rows of ``markov_w2`` the loss scores: all, or
    the draft vocabulary's) -> ``[R, n, V']``. The same steps as `DSparkHead.rollout` with the
    true previous tokens in place of the drafted ones (a loop over the block's slots: the
    ``rnn`` state carries from slot to slot).
    """
    state = head.init_state(slots)
    out = []
    for s in range(slots.shape[1]):
        bias, state = head.step(prev[:, s], slots[:, s], state, w2)
        out.append(bias)
    return torch.stack(out, dim=1)
