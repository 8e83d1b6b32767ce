"""DFlash training blocks: anchors, the block attention mask, labels and the loss.

Many blocks of one sequence are trained in one drafter forward (SpecForge
``create_dflash_block_mask``). For a sequence of ``T`` tokens with cached target
features and ``N`` anchors ``a_0..a_{N-1}`` (all in the response), block ``j`` is
``[x[a_j], MASK x (B-1)]`` at positions ``a_j .. a_j+B-1``::

    KV:      [ context features 0..T-1 | block 0 | block 1 | ... | block N-1 ]
    block j:   position p visible iff    | only its own block (bidirectional)
               p < a_j (strictly before its anchor: at inference the anchor's own
               features are not known yet)

Slot ``k = 1..B-1`` of block ``j`` predicts ``x[a_j + k]``, a target-generated token
(self-distillation); slots past the end of the sequence are ignored. The loss is
cross-entropy weighted by ``w_k = exp(-(k-1)/gamma)``: early slots matter most, since a
draft is only accepted up to its first miss. Optionally (``sample_slots``) each slot is
kept with probability ``w_k`` and the kept ones count with weight 1: the same loss in
expectation, with ``sum(w) / (B-1)`` (~45 % at B=16, gamma=7) of the ``lm_head``
work, which dominates a CPU training step. With a reduced head (the draft vocabulary's
top ``K`` tokens, ``label_map`` from `vocab_rows`) the cross-entropy runs over those ``K``
rows only: ``K / V`` of the head's work, which lets every slot be scored. Glossary: ``bs`` sequences, ``T`` padded
length, ``N`` anchors per sequence, ``B`` block size, ``H`` hidden size, ``V`` vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["IGNORE", "block_inputs", "block_labels", "block_mask", "dflash_loss", "sample_anchors",
           "slot_weights", "vocab_rows"]

IGNORE = -100  # label of a slot without a target token


def sample_anchors(prompt_lens: Tensor, seq_lens: Tensor, num: int, generator: torch.Generator,
                   max_offset: int | None = None) -> Tensor:
    """``num`` distinct anchors per sequence, uniform over its response positions.

    An anchor ``a`` satisfies ``prompt_len <= a <= seq_len - 2`` (its first label
    ``a + 1`` exists) and, with ``max_offset``, ``a - prompt_len < max_offset``: the
    anchors a decode of ``max_offset + 1`` new tokens draws from (response positions
    ``0 .. max_offset - 1``). Sequences with fewer candidates repeat none: their extra
    anchors are ``-1`` (padding blocks, fully ignored).

    Parameters
    ----------
    prompt_lens, seq_lens : Tensor
        ``[bs]`` long.

    Returns
    -------
    Tensor
        ``[bs, num]`` long, sorted ascending within a row, ``-1`` padding last.
    """
    rows = []
    for p, t in zip(prompt_lens.tolist(), seq_lens.tolist(), strict=True):
        cand = max(0, t - 1 - p)
        if max_offset is not None:
            cand = min(cand, max_offset)
        pick = torch.randperm(cand, generator=generator)[:num] + p
        pick = pick.sort().values
        rows.append(torch.cat([pick, pick.new_full((num - pick.numel(),), -1)]))
    return torch.stack(rows)


def block_inputs(input_ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int) -> tuple[Tensor, Tensor]:
    """Block token ids and positions.

    ``input_ids [bs, T]``, ``anchors [bs, N]`` -> ids ``[bs, N*B]`` (``[x[a_j], MASK...]``
    per block; padding blocks hold MASK only) and positions ``[bs, N*B]`` long
    (``a_j + 0..B-1``; padding blocks use ``0..B-1``).
    """
    bs, n = anchors.shape
    ids = torch.full((bs, n, block_size), mask_token_id, dtype=torch.long, device=input_ids.device)
    first = input_ids.gather(1, anchors.clamp(min=0))
    ids[:, :, 0] = torch.where(anchors >= 0, first, mask_token_id)
    pos = anchors.clamp(min=0)[:, :, None] + torch.arange(block_size, device=anchors.device)
    return ids.reshape(bs, n * block_size), pos.reshape(bs, n * block_size)


def block_labels(input_ids: Tensor, anchors: Tensor, seq_lens: Tensor, block_size: int) -> Tensor:
    """Labels of slots ``1..B-1``: ``[bs, N, B-1]`` long, ``x[a_j + k]`` or `IGNORE`.

    ``input_ids [bs, T]`` (padded), ``anchors [bs, N]`` (``-1`` = padding block),
    ``seq_lens [bs]``: slots at or past ``seq_len`` and padding blocks are `IGNORE`.
    """
    k = torch.arange(1, block_size, device=anchors.device)
    pos = anchors[:, :, None] + k  # [bs, N, B-1]
    valid = (anchors[:, :, None] >= 0) & (pos < seq_lens[:, None, None])
    flat = pos.clamp(0, input_ids.shape[1] - 1).reshape(anchors.shape[0], -1)
    labels = input_ids.gather(1, flat).view_as(pos)
    return torch.where(valid, labels, torch.full_like(labels, IGNORE))


def block_mask(anchors: Tensor, context_len: int, block_size: int) -> Tensor:
    """The training attention mask, ``[bs, N*B, T + N*B]`` bool (True = attend).

    Query ``j*B + i`` sees context key ``p`` iff ``p < a_j`` and block key ``j'*B + i'``
    iff ``j' == j``. A padding block (``a_j = -1``) sees only itself, so no row is empty.
    """
    bs, n = anchors.shape
    ctx = torch.arange(context_len, device=anchors.device)
    see_ctx = ctx[None, None, :] < anchors[:, :, None]  # [bs, N, T]
    blk = torch.arange(n, device=anchors.device)
    see_blk = (blk[:, None] == blk[None, :])  # [N, N]
    see_ctx = see_ctx[:, :, None, :].expand(bs, n, block_size, context_len)
    see_blk = see_blk[None, :, None, :, None].expand(bs, n, block_size, n, block_size)
    return torch.cat([see_ctx.reshape(bs, n * block_size, context_len),
                      see_blk.reshape(bs, n * block_size, n * block_size)], dim=-1)


def vocab_rows(token_ids: Tensor, vocab_size: int) -> Tensor:
    """``[V]`` long: the row of each target token in a reduced head over ``token_ids``
    (``[K]``, e.g. the top ``K`` of a draft vocabulary), ``-1`` for the others."""
    out = torch.full((vocab_size,), -1, dtype=torch.long)
    out[token_ids.long().cpu()] = torch.arange(token_ids.numel())
    return out


def slot_weights(block_size: int, gamma: float, device: torch.device | None = None) -> Tensor:
    """``[B-1]`` float32: ``exp(-(k-1)/gamma)`` for slots ``k = 1..B-1``."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def dflash_loss(hidden: Tensor, labels: Tensor, lm_head: nn.Module, gamma: float,
                chunk_tokens: int = 1024, sample_slots: torch.Generator | None = None,
                label_map: Tensor | None = None, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Weighted cross-entropy over the supervised slots, logits only where needed.

    Parameters
    ----------
    hidden : Tensor
        ``[bs, N*B, H]`` drafter output (after its final norm).
    labels : Tensor
        ``[bs, N, B-1]`` long from `block_labels`.
    lm_head : nn.Module
        The target's (frozen) output projection ``H -> V``, or a reduced head ``H -> K``
        (the draft vocabulary, `DraftVocabHead`) together with ``label_map``.
    chunk_tokens : int
        Logits are built for at most this many slots at a time; with several chunks each
        is recomputed in backward (activation checkpointing), so peak memory is
        ``chunk_tokens * V`` floats instead of ``num_slots * V``.
    sample_slots : torch.Generator or None
        If given, keep each labelled slot with probability ``w_k`` (drawn from this
        generator on the CPU) and weight the kept ones 1; the denominator stays
        ``sum(w_k)`` over labelled slots, so the loss is unbiased for the full one.
    label_map : Tensor or None
        ``[V]`` long: a target token's row in the reduced head, ``-1`` outside it. The
        cross-entropy is then over the ``K`` draft-vocabulary tokens, and a slot whose
        label is outside them is not scored (a reduced-head draft can never match it).
    bias : Tensor or None
        ``[bs, N, B-1, V']``: added to the logits of each slot (a DSpark Markov head's,
        `heads.markov_bias`; ``V'`` the head's rows, the reduced ones with ``label_map``).

    Returns
    -------
    tuple of Tensor
        The scalar loss ``sum(w_k * ce) / sum(w_k)`` over labelled slots, and the
        per-slot top-1 accuracy ``[B-1]`` over the slots scored (float32, no grad; NaN
        for a slot with none).
    """
    bs, n, width = labels.shape
    h = hidden.view(bs, n, width + 1, -1)[:, :, 1:]  # slot 0 is the anchor: no loss
    if label_map is not None:  # target ids -> reduced-head rows; outside the head: unscored
        mapped = label_map.to(labels.device)[labels.clamp(min=0)]
        labels = torch.where((labels != IGNORE) & (mapped >= 0), mapped, torch.full_like(labels, IGNORE))
    labelled = labels != IGNORE  # [bs, N, B-1]
    weights = slot_weights(width + 1, gamma, hidden.device).expand(bs, n, width)
    denom = weights[labelled].sum().clamp(min=1e-12)
    keep = labelled
    if sample_slots is not None:
        draw = torch.rand(labels.shape, generator=sample_slots).to(hidden.device)
        keep = labelled & (draw < weights)
        weights = torch.ones_like(weights)
    h, y, w = h[keep], labels[keep], weights[keep]  # [M, H], [M], [M]
    b = None if bias is None else bias[keep]  # [M, V']
    slot = torch.arange(width, device=hidden.device).expand(bs, n, width)[keep]

    def chunk_ce(hc: Tensor, yc: Tensor, bc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        logits = lm_head(hc).float()
        if bc is not None:
            logits = logits + bc.float()
        return F.cross_entropy(logits, yc, reduction="none"), (logits.argmax(-1) == yc)

    ces, hits = [], []
    many = h.shape[0] > chunk_tokens
    for s in range(0, h.shape[0], chunk_tokens):
        hc, yc = h[s: s + chunk_tokens], y[s: s + chunk_tokens]
        bc = None if b is None else b[s: s + chunk_tokens]
        ce, hit = (checkpoint(chunk_ce, hc, yc, bc, use_reentrant=False) if many and torch.is_grad_enabled()
                   else chunk_ce(hc, yc, bc))
        ces.append(ce)
        hits.append(hit)
    if not ces:  # nothing scored (every label outside the head, or none): a zero that still backpropagates
        return hidden.sum() * 0.0, torch.full((width,), math.nan, device=hidden.device)
    ce = torch.cat(ces)
    loss = (w * ce).sum() / denom
    with torch.no_grad():
        hit = torch.cat(hits).float() if hits else hidden.new_zeros(0)
        count = torch.zeros(width, device=hidden.device).index_add_(0, slot, torch.ones_like(hit))
        acc = torch.zeros(width, device=hidden.device).index_add_(0, slot, hit) / count
        acc = torch.where(count > 0, acc, torch.full_like(acc, math.nan))
    return loss, acc
