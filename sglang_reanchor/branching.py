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

__all__ = ["branch_candidates", "branch_rows"]


def branch_rows(config: ReAnchorConfig, num_drafts: int) -> int:
    """``M``: the branch rows a round lays for ``num_drafts`` baseline drafts (a host number; 0 without
    branching). Fixed per config, whatever the node budget of the round."""
    if not config.branch_width:
        return 0
    if config.branch_shape == "best_first":
        return config.branch_rows
    return min(config.branch_rows, num_drafts * config.branch_width)


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
    if config.branch_shape == "best_first":
        return _best_first(baseline, top.values, top.indices if token_ids is None else token_ids[top.indices],
                           config)
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


def _best_first(baseline: Tensor, values: Tensor, indices: Tensor, config: ReAnchorConfig) -> Branches:
    """DDTree's best-first tree below ``baseline``, as branch rows (``config.branch_shape="best_first"``).

    ``values``, ``indices`` ``[bs, n, K]``: every slot's top ``K = 1 + branch_width`` probabilities and
    tokens, the draft first. A node is a path of choices ``c_1 .. c_d`` (``c_t`` in ``0 .. K-1``, 0 the
    baseline's draft), worth ``prod_t values[t, c_t]``: the chance that the target accepts it all, were the
    slots independent (DFlash drafts them in parallel). Its parent is worth at least as much, so the
    ``node_budget - 1`` best nodes form a tree, and a beam of that width per depth finds them exactly (a
    node among the best has its parent among the best of the depth above). A path keeps at most
    ``branch_length`` tokens after it leaves the baseline, and with ``verify_threshold`` only nodes worth
    at least that. Each leaf off the baseline becomes a row: its path from where it leaves the baseline
    (``sites``), the most valuable ``branch_rows`` leaves first; the trie merges what rows share.
    The loop runs over depths (``n`` host steps), never over nodes.
    """
    bs, width = baseline.shape
    n, k = values.shape[1], values.shape[2]
    budget = max(config.node_budget - 1, 1)
    dev = baseline.device
    # choice 0 is the baseline's own draft, whatever the top-k's order among ties
    tokens = torch.cat([baseline[:, 1:1 + n, None], indices[..., 1:]], dim=-1)  # [bs, n, K]
    # float64 and a tiny cost per depth: a child never outranks its parent, even where p = 1
    log_v = values.double().clamp(min=1e-300).log() - 1e-9
    floor = -math.inf if config.verify_threshold is None else math.log(config.verify_threshold)
    choice = torch.arange(k, device=dev)

    score = torch.zeros(bs, 1, dtype=torch.float64, device=dev)  # the root
    site = torch.zeros(bs, 1, dtype=torch.long, device=dev)  # depth where a path left the baseline; 0 = on it
    path = torch.zeros(bs, 1, 0, dtype=torch.long, device=dev)  # [bs, B, d]: tokens of each path
    levels: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # per depth: score, site, path, parent
    for t in range(1, n + 1):
        cand = score[:, :, None] + log_v[:, None, t - 1, :]  # [bs, B, K]
        off = torch.where(site[:, :, None] > 0, site[:, :, None], torch.where(choice > 0, t, 0))
        cand = cand.masked_fill((off > 0) & (t - off >= config.branch_length), -math.inf)
        cand = cand.masked_fill(cand < floor, -math.inf).flatten(1)  # [bs, B*K]
        score, best = cand.topk(min(budget, cand.shape[1]), dim=1)
        parent = best // k
        site = off.flatten(1).gather(1, best)
        token = tokens[:, t - 1].gather(1, best % k)
        path = torch.cat([path.gather(1, parent[:, :, None].expand(-1, -1, t - 1)), token[:, :, None]], dim=2)
        levels.append((score, site, path, parent))

    # the budget's best nodes over all depths; -inf (pruned) never counts
    keys = torch.cat([lv[0] for lv in levels], dim=1)  # [bs, T]
    kth = keys.topk(min(budget, keys.shape[1]), dim=1).values[:, -1:]
    chosen = [(lv[0] >= kth) & (lv[0] > -math.inf) for lv in levels]
    # a leaf: chosen, off the baseline, and no chosen child
    leaf_key, leaf_site, leaf_path = [], [], []
    for t, (lv_score, lv_site, lv_path, _) in enumerate(levels, start=1):
        children = torch.zeros_like(lv_site)
        if t < n:
            children.scatter_add_(1, levels[t][3], chosen[t].long())
        leaf = chosen[t - 1] & (lv_site > 0) & (children == 0)
        leaf_key.append(lv_score.masked_fill(~leaf, -math.inf))
        leaf_site.append(lv_site)
        leaf_path.append(torch.nn.functional.pad(lv_path, (0, n - t)))
    key_all = torch.cat(leaf_key, dim=1)
    depth_all = torch.cat([torch.full_like(s, t) for t, s in enumerate(leaf_site, start=1)], dim=1)
    site_all, path_all = torch.cat(leaf_site, dim=1), torch.cat(leaf_path, dim=1)  # [bs, T], [bs, T, n]
    m = config.branch_rows
    if key_all.shape[1] < m:  # fewer candidate nodes than rows: pad with nothing
        pad = m - key_all.shape[1]
        key_all = torch.nn.functional.pad(key_all, (0, pad), value=-math.inf)
        depth_all, site_all = (torch.nn.functional.pad(x, (0, pad), value=1) for x in (depth_all, site_all))
        path_all = torch.nn.functional.pad(path_all, (0, 0, 0, pad))
    key, row = key_all.topk(m, dim=1)  # [bs, M], the most valuable leaves first
    sites = site_all.gather(1, row)
    lengths = depth_all.gather(1, row) - sites + 1
    j = torch.arange(width, device=dev)
    cols = (sites[:, :, None] - 1 + j).clamp(0, n - 1)  # [bs, M, W]: path index of each row token
    rows = path_all.gather(1, row[:, :, None].expand(-1, -1, n)).gather(2, cols)
    valid = key > -math.inf
    return Branches(tokens=rows, sites=torch.where(valid, sites, -1), lengths=torch.where(valid, lengths, 1))
