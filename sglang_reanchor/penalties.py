"""Sampling penalties on a draft tree: every node scored with the history of its own path.

Plain decoding penalises the token after ``history`` (the request's output so
far) by what ``history`` contains. In a verify forward, node ``i`` stands for the
output ``history + path(i)``, where ``path(i)`` are the draft tokens from the
root's child down to ``i`` (the root is the last committed token, already part
of ``history``). Applying one per-request penalty to every node, as a chain
verifier can when it only ever keeps the first node, scores the deeper nodes
with a stale history and changes the output, at temperature 0 too.

The penalties are SGLang's (``sglang.srt.sampling.penaltylib``), on logits:

- frequency ``f``: ``logit -= f * count(token)``
- presence ``p``: ``logit -= p`` for every token present
- min new tokens ``m``: stop tokens get ``-inf`` while fewer than ``m`` tokens are out
- repetition ``r`` (after the additive ones): a present token's logit is divided by
  ``r`` when positive, multiplied by ``r`` when negative

Pure torch; tensor operations over ``[bs, N, V]``, no loop per node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .tree import DraftTree

__all__ = ["Penalties", "history_counts", "penalize_tree"]


@dataclass(frozen=True)
class Penalties:
    """Per-request penalty settings, all ``[bs]`` (neutral: 0, 0, 1, 0).

    ``stop_mask``: ``[bs, V]`` bool, the tokens ``min_new_tokens`` holds back.
    """

    frequency: Tensor  # [bs] float
    presence: Tensor  # [bs] float
    repetition: Tensor  # [bs] float, > 0
    min_new_tokens: Tensor  # [bs] long
    stop_mask: Tensor  # [bs, V] bool


def history_counts(outputs: list[list[int]], vocab_size: int, device: torch.device | str = "cpu") -> Tensor:
    """``[bs, V]`` float32: how often each token occurs in each request's output so far."""
    lens = torch.tensor([len(o) for o in outputs], dtype=torch.long)
    counts = torch.zeros(len(outputs), vocab_size, dtype=torch.float32, device=device)
    if int(lens.sum()):
        rows = torch.repeat_interleave(torch.arange(len(outputs)), lens).to(device)
        ids = torch.tensor([t for o in outputs for t in o], dtype=torch.long, device=device)
        counts.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.float32), accumulate=True)
    return counts


def penalize_tree(logits: Tensor, tree: DraftTree, history: Tensor, output_lens: Tensor,
                  penalties: Penalties) -> Tensor:
    """The penalised logits of every node, ``[bs, N, V]`` (a new tensor, float32).

    ``logits``: ``[bs, N, V]``, row ``i`` = the target after node ``i``;
    ``history``: ``[bs, V]`` counts of the committed output (`history_counts`);
    ``output_lens``: ``[bs]`` long, tokens out so far (the root included).
    """
    bs, width, vocab = logits.shape
    dev = logits.device
    on_path = tree.ancestor_mask().clone()  # [bs, N, N]: j on the root -> i path
    on_path[:, :, 0] = False  # the root is the last committed token: counted in history
    ids = tree.tokens.clamp(0, vocab - 1)[:, None, :].expand(bs, width, width)
    counts = history.to(dev, torch.float32)[:, None, :].repeat(1, width, 1)  # [bs, N, V]
    counts.scatter_add_(2, ids, on_path.to(torch.float32))
    present = counts > 0
    out = logits.float() - penalties.frequency.to(dev, torch.float32)[:, None, None] * counts
    out = out - penalties.presence.to(dev, torch.float32)[:, None, None] * present
    produced = output_lens.to(dev)[:, None] + tree.depth  # [bs, N]: tokens out before node i's successor
    hold = (produced < penalties.min_new_tokens.to(dev)[:, None])[:, :, None] & penalties.stop_mask.to(dev)[:, None]
    out = out.masked_fill(hold, -float("inf"))
    rep = penalties.repetition.to(dev, torch.float32)[:, None, None].expand_as(out)
    scaled = torch.where(out < 0, out * rep, out / rep)
    return torch.where(present, scaled, out)
