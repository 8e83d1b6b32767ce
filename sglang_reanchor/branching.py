"""Branching: second and third choices of the drafter's own distributions, as short chains.

A block drafter gives a whole distribution at every slot, and DFlash keeps only each
slot's argmax ``g_t``. Where the target rejects ``g_t`` it often picks the drafter's
second or third choice instead. A *branch* is such an alternative ``c`` at depth ``t``
followed by the baseline's own later drafts ``g_{t+1}, ...`` (DFlash's slots are drafted
in parallel from the anchor, so the later drafts do not depend on the token at ``t``):
the chain ``[c, g_{t+1}, ..., g_{t+L-1}]`` hanging below the baseline node at depth
``t - 1``. Branches join ReAnchor's shifted rows in one trie (`tree.build_draft_tree`)
under one node budget; drafts stay a deterministic function of the context, so
verification stays exactly lossless at every temperature.

Which branches: the value of alternative ``c`` at depth ``t`` is the chance the target
reaches depth ``t`` on the baseline and then picks ``c``::

    score(t, c) = prod_{i < t} q_i  *  p_t(c),      q_i = p_i(g_i)

with ``p`` the drafter's distribution at temperature ``branch_temperature`` (a
calibration: raw block-drafter probabilities are over-confident; fitted on
development prompts, `bench`). For a Domino or DSpark head, ``p_t`` is the head's corrected
distribution along its own rollout (given ``g_1 .. g_{t-1}``; `DraftHead.rollout_with_scores`), and
the branch's later tokens are drafts made after ``g_t``, not after ``c``: a guess like any draft.
The ``branch_rows`` best alternatives of the top
``1 + branch_width`` tokens of every slot are kept, best first (the order of their
rows, so a node budget drops the least likely first), each ``branch_length`` tokens
long. All widths are host numbers: nothing here reads the device.

With ``verify_threshold = p`` the same rule that cuts the drafted rows cuts the
branches: a branch token is verified only while the drafter's chance of the path
reaching it with every token right stays ``>= p``, its score times the baseline's
later probabilities, ``score(t, c) * prod_{t < i <= t+k} q_i`` for its ``k``-th
token after ``c``. A branch whose score is below ``p`` is dropped (``sites = -1``).
So a round branches where the drafter hesitates and runs a plain chain where it is
sure, with no budget to tune.

>>> import torch
>>> from sglang_reanchor.config import ReAnchorConfig
>>> baseline = torch.tensor([[9, 1, 2, 3]])                    # bonus 9, drafts 1 2 3
>>> logits = torch.log(torch.tensor([[[.1, .6, .3, 0, 0], [.2, 0, .7, .1, 0], [0, 0, 0, .9, .1]]]))
>>> b = branch_candidates(baseline, logits, ReAnchorConfig(branch_width=1, branch_rows=2, branch_length=2))
>>> b.tokens[..., :2].tolist(), b.sites.tolist(), b.lengths.tolist()   # [alt, next draft], best first
([[[2, 2], [0, 3]]], [[1, 2]], [[2, 2]])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import ReAnchorConfig
from .tree import Branches

__all__ = ["branch_candidates"]


def branch_candidates(baseline: Tensor, logits: Tensor, config: ReAnchorConfig,
                      token_ids: Tensor | None = None) -> Branches:
    """The ``config.branch_rows`` best branches below ``baseline``.

    Parameters
    ----------
    baseline : Tensor
        ``[bs, W]`` long: the bonus, then the baseline drafts ``g_1 .. g_{W-1}``.
    logits : Tensor
        ``[bs, n, V']``, ``n <= W - 1``: the drafter's logits at slots ``1 .. n`` of the
        baseline block (over the whole vocabulary, or over ``token_ids``).
    config : ReAnchorConfig
        ``branch_width``, ``branch_rows``, ``branch_length``, ``branch_temperature``.
    token_ids : Tensor, optional
        ``[V']`` long: the token of each logit column (a reduced draft vocabulary).

    Returns
    -------
    Branches
        ``tokens [bs, M, W]``, ``sites [bs, M]``, ``lengths [bs, M]``, ``M = branch_rows``
        (or every candidate, if fewer); a branch whose alternative is the draft itself
        cannot occur (the top token is the draft, and alternatives come after it).
    """
    bs, width = baseline.shape
    n, vocab = logits.shape[1], logits.shape[2]
    k = min(config.branch_width, vocab - 1)
    probs = (logits.float() / config.branch_temperature).softmax(-1)
    top = probs.topk(1 + k, dim=-1)  # [bs, n, 1+k]: the draft itself first
    q = top.values[..., 0]  # p_t(g_t)
    reach = torch.nn.functional.pad(q.cumprod(dim=1)[:, :-1], (1, 0), value=1.0)  # prod_{i<t} q_i
    score = (reach[:, :, None] * top.values[..., 1:]).reshape(bs, n * k)  # [bs, n*k], depth-major
    m = min(config.branch_rows, n * k)
    best = score.topk(m, dim=1).indices  # [bs, M], best first
    depth = best // k + 1  # t in 1..n
    alt = top.indices[..., 1:].reshape(bs, n * k).gather(1, best)
    if token_ids is not None:
        alt = token_ids[alt]
    # row m: [alt, g_{t+1}, g_{t+2}, ...]: the baseline shifted left by t, its first token replaced
    j = torch.arange(width, device=baseline.device)
    later = baseline.gather(1, (depth[:, :, None] + j).clamp(max=width - 1).reshape(bs, -1)).view(bs, m, width)
    tokens = torch.where(j == 0, alt[:, :, None], later)
    lengths = torch.minimum(torch.full_like(depth, config.branch_length), width - depth)
    sites = depth
    if config.verify_threshold is not None:
        sites, lengths = _cut(q, score.gather(1, best), depth, lengths, min(config.branch_length, width),
                              config.verify_threshold)
    return Branches(tokens=tokens, sites=sites, lengths=lengths)


def _cut(q: Tensor, score: Tensor, depth: Tensor, lengths: Tensor, max_length: int,
         threshold: float) -> tuple[Tensor, Tensor]:
    """``(sites, lengths)`` of branches cut where their running score falls below ``threshold``.

    ``q [bs, n]``: the baseline drafts' probabilities; ``score``, ``depth``, ``lengths`` ``[bs, M]``;
    ``max_length``: a host bound on ``lengths`` (no device read).
    Token ``k`` of a branch at depth ``t`` scores ``score * prod_{t < i <= t+k} q_i``; past slot
    ``n`` nothing says how sure the drafter is, so nothing is kept there.
    """
    n = q.shape[1]
    log_q = torch.nn.functional.pad(q.clamp(min=1e-30).log().cumsum(dim=1), (1, 0))  # [bs, 1+n]: sum_{i<=j}
    k = torch.arange(max_length, device=q.device)
    slot = depth[:, :, None] + k  # [bs, M, K]: the baseline slot of each branch token
    later = (log_q.gather(1, slot.clamp(max=n).flatten(1)).view_as(slot)
             - log_q.gather(1, depth)[:, :, None])
    running = score.clamp(min=1e-30).log()[:, :, None] + later
    keep = (running >= math.log(threshold)) & (slot <= n) & (k < lengths[:, :, None])
    kept = keep.sum(dim=-1)  # the running score only falls: the kept tokens lead
    return torch.where(kept > 0, depth, -1), kept.clamp(min=1)
