"""Training a family head (DSpark's Markov head, Domino's GRU correction) on a frozen DFlash backbone.

A block drafter drafts every slot of a block at once, so slot ``k`` cannot see what
slot ``k-1`` drafted. The family heads add that dependence as a bias on the base logits:

- DSpark (`drafter.dspark`): ``bias = markov_w2(f(markov_w1[prev], h_k, state))``, ``prev``
  the token drafted at the slot before (``2 V r`` parameters and, for the ``gated`` /
  ``rnn`` kinds, one projection);
- Domino (`drafter.domino`): ``bias = embed_proj(cat(h_k, gru_k))``, ``gru_k`` a GRU's
  state over the embeddings of the anchor and every draft before slot ``k``; slot 1 has
  none (``pure_draft_prefix_len = 1``).

Both are small next to the backbone, so they train quickly on one that is already
trained and kept frozen. `with_dspark_head` / `with_domino_head` turn a DFlash drafter
into one of the family with the same backbone, in DFlash's query layout (slot ``k``
predicts ``x[a + k]``, as the backbone was trained), and a head whose output weight
starts at exactly zero (``markov_w2 = 0``, ``embed_proj.2 = 0``): before its first step
it drafts the backbone's tokens. `with_head_of` carries a trained head onto a retrained
backbone of the same shape (a short head-only run there adapts it). `teacher_forced_bias`
is the head teacher-forced: the previous tokens at slot ``k`` are the true
``x[a + 1 .. a + k - 1]`` (after the anchor). That is exact for what decoding measures: a draft only counts while every
earlier draft was right, and then the drafted tokens *are* the true ones.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..drafter import DFlashConfig, DFlashDrafter
from ..drafter.domino import DominoDrafter, DominoSettings
from ..drafter.dspark import MARKOV_HEAD_TYPES, DSparkDrafter, DSparkSettings, MarkovHead
from .loss import IGNORE

__all__ = ["FAMILY_HEADS", "domino_bias", "head_parameters", "markov_bias", "teacher_forced_bias",
           "teacher_forced_prev", "with_domino_head", "with_dspark_head", "with_head_of"]

FAMILY_HEADS = ("dspark", "domino")  # what `train add-head --family` builds


def _with_backbone(family: Any, config: DFlashConfig, settings: Any, drafter: DFlashDrafter, seed: int) -> Any:
    """A fresh ``family(config, settings)`` drafter (its head drawn from ``seed``) holding
    ``drafter``'s backbone and draft vocabulary, in ``drafter``'s dtype, device and mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        new = family(config, settings)
    new = new.to(device=drafter.fc.weight.device, dtype=drafter.fc.weight.dtype)
    missing, unexpected = new.load_state_dict(drafter.state_dict(), strict=False)
    backbone = set(drafter.state_dict())
    if unexpected or any(k in backbone for k in missing):
        raise AssertionError(f"backbone copy: missing {missing}, unexpected {unexpected}")
    new.vocab_ranking = drafter.vocab_ranking
    assert new.block_size == drafter.block_size
    return new.train(drafter.training)


def _check_backbone(drafter: DFlashDrafter, what: str) -> None:
    if type(drafter) is not DFlashDrafter:
        raise ValueError(f"{what} takes a DFlash drafter (its backbone), got a {drafter.family_name} one")


def with_dspark_head(drafter: DFlashDrafter, markov_rank: int, markov_head_type: str = "gated",
                     seed: int = 0) -> DSparkDrafter:
    """A DSpark drafter with ``drafter``'s backbone (and draft vocabulary) and a new Markov head
    (``markov_w1 ~ N(0, initializer_range)``, ``markov_w2 = 0``, the projections' default init):
    its drafts equal ``drafter``'s until the head is trained. No confidence head."""
    _check_backbone(drafter, "with_dspark_head")
    if markov_head_type not in MARKOV_HEAD_TYPES:
        raise ValueError(f"markov_head_type must be one of {MARKOV_HEAD_TYPES}, got {markov_head_type!r}")
    settings = DSparkSettings(markov_rank=markov_rank, markov_head_type=markov_head_type,
                              sample_from_anchor=False, confidence_head=False)
    config = dataclasses.replace(drafter.config, block_size=drafter.config.block_size - 1)  # DSpark's gamma
    dspark = _with_backbone(DSparkDrafter, config, settings, drafter, seed)
    with torch.no_grad():
        dspark.markov_head.markov_w2.weight.zero_()
    return dspark


def with_domino_head(drafter: DFlashDrafter, gru_hidden_dim: int = 128, emb_dim: int = 64,
                     seed: int = 0) -> DominoDrafter:
    """A Domino drafter with ``drafter``'s backbone (and draft vocabulary) and a new GRU
    correction head (``shift_label = false``: DFlash's query layout; ``prefix_gru`` and
    ``embed_proj.0`` at torch's default init, ``embed_proj.2 = 0``): its drafts equal
    ``drafter``'s until the head is trained. ``embed_proj.2`` is ``[V, emb_dim]``, the
    largest part of the head: ``emb_dim`` sets its size."""
    _check_backbone(drafter, "with_domino_head")
    settings = DominoSettings(shift_label=False, gru_hidden_dim=gru_hidden_dim, emb_dim=emb_dim)
    domino = _with_backbone(DominoDrafter, drafter.config, settings, drafter, seed)
    with torch.no_grad():
        domino.embed_proj[2].weight.zero_()
    return domino


def with_head_of(headed: DFlashDrafter, drafter: DFlashDrafter) -> DFlashDrafter:
    """``headed``'s head (a trained DSpark or Domino drafter's) on ``drafter``'s backbone and draft
    vocabulary, in ``drafter``'s dtype and device: every backbone tensor replaced, the head's kept.
    For a backbone trained further after the head was trained on it; a short `fit --head-only` from
    the result adapts the head to it. Raises ValueError where the two backbones differ in shape or
    in what they read (target layers, mask token, block)."""
    _check_backbone(drafter, "with_head_of")
    head_parameters(headed)  # a family drafter with a head, or a clear error
    ours = dataclasses.replace(headed.config, block_size=headed.block_size)  # DSpark's config holds its gamma
    differ = [f.name for f in dataclasses.fields(drafter.config)
              if f.compare and f.name != "dtype" and getattr(ours, f.name) != getattr(drafter.config, f.name)]
    if differ:
        raise ValueError(f"with_head_of: the backbone's config differs from the headed drafter's in {differ}: "
                         "a head moves only between backbones of one shape")
    new = copy.deepcopy(headed).to(device=drafter.fc.weight.device, dtype=drafter.fc.weight.dtype)
    backbone = drafter.state_dict()
    head = set(new.state_dict()) - set(backbone)
    missing, unexpected = new.load_state_dict(backbone, strict=False)
    if unexpected or set(missing) != head:
        raise AssertionError(f"backbone copy: missing {missing}, unexpected {unexpected}")
    new.vocab_ranking = drafter.vocab_ranking
    return new.train(drafter.training)


def head_parameters(drafter: DFlashDrafter) -> list[torch.nn.Parameter]:
    """The parameters of a family drafter's head (what a head-only run trains): DSpark's Markov
    head, Domino's ``prefix_gru`` and ``embed_proj``; raises for a drafter without one."""
    if isinstance(drafter, DSparkDrafter):
        return list(drafter.markov_head.parameters())
    if isinstance(drafter, DominoDrafter):
        return [*drafter.prefix_gru.parameters(), *drafter.embed_proj.parameters()]
    raise ValueError(f"a head-only run trains a DSpark or Domino drafter's head; this is a {drafter.family_name} "
                     "drafter (make one with `train add-head`)")


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


def domino_bias(drafter: DominoDrafter, embed: nn.Module, slots: Tensor, prev: Tensor, out_w: Tensor) -> Tensor:
    """Domino's correction of every proposal slot, teacher-forced.

    ``slots [R, n, H]``, ``prev [R, n]`` long (`teacher_forced_prev`), ``out_w [V', E]`` (the rows
    of ``embed_proj.2`` the loss scores) -> ``[R, n, V']``, zero at slot 1. The GRU reads the
    embeddings of ``prev`` in one call: its output after ``prev[:, :k+1]`` is the state
    `DominoHead.rollout` holds at slot ``k+1``.
    """
    gru = drafter.prefix_gru
    states, _ = gru(embed(prev).to(gru.weight_ih_l0.dtype))  # [R, n, G]
    latent = drafter.embed_proj[1](drafter.embed_proj[0](torch.cat((slots[:, 1:], states[:, 1:].to(slots.dtype)), -1)))
    bias = F.linear(latent, out_w)  # [R, n-1, V']
    return torch.cat((torch.zeros_like(bias[:, :1]), bias), dim=1)


def teacher_forced_bias(drafter: DFlashDrafter, embed: nn.Module, slots: Tensor, prev: Tensor,
                        head_ids: Tensor | None) -> Tensor | None:
    """A family head's bias on the proposal slots' base logits, teacher-forced (None for DFlash).

    ``slots [R, n, H]`` (the blocks' proposal-slot hidden states, DFlash's query layout),
    ``prev [R, n]`` long (`teacher_forced_prev`), ``head_ids [V']`` (the rows scored: a draft
    vocabulary) or None (every row) -> ``[R, n, V']``. Domino's candidate pool is not applied:
    the correction scores every row (decoding restricts it to the pool's tokens).
    """
    if isinstance(drafter, DSparkDrafter):
        w2 = drafter.markov_head.markov_w2.weight
        return markov_bias(drafter.markov_head, slots, prev, w2 if head_ids is None else w2[head_ids.to(w2.device)])
    if isinstance(drafter, DominoDrafter):
        out_w = drafter.embed_proj[2].weight
        return domino_bias(drafter, embed, slots, prev, out_w if head_ids is None else out_w[head_ids.to(out_w.device)])
    return None
