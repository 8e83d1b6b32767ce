"""Teacher-forced block acceptance: a validation that sees a change, with no target pass.

For a held-out sequence (a stored target greedy response with its cached features) and
an anchor ``a`` in its response, the drafter drafts the block after ``x[a]`` exactly as
a decoding round anchored there does: it sees the target features strictly before
``a`` and the block ``[x[a], MASK x (B-1)]``, and drafts ``argmax`` of each slot
``k = 1..B-1``. Because the response *is* the target's greedy continuation, a round
anchored at ``a`` accepts drafts up to the first slot whose draft differs from
``x[a + k]``; its acceptance length (accepted drafts + 1, DFlash's tau for one round)
is ``1 + (leading matches)``. No target forward is needed, so thousands of anchors cost
a few drafter forwards, against ~140 rounds of the 4-prompt generation tau.

Anchors are drawn like decoding draws them: uniform over response positions
``0 .. max_offset - 1`` (a decode of ``max_offset + 1`` tokens), ``anchors_per_seq``
distinct ones per sequence, from a fixed seed, so every checkpoint is scored on the same
anchors (paired comparisons). Blocks cut by the end of a response end there, as a
decode capped at that length would.

The standard error is cluster-robust by sequence (anchors of one response are
correlated): ``se = sqrt(G / (G - 1) * sum_g (S_g - m * n_g)^2) / n`` over ``G``
sequences with ``n_g`` anchors and acceptance sum ``S_g``. The headline figure
(`AcceptanceReport.balanced`) is the mean of the per-group means (math, stub, other:
the benchmark's GSM8K / HumanEval / MT-Bench-like work), its SE from the groups' SEs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..drafter import DFlashDrafter
from ..drafter.domino import DominoDrafter
from ..drafter.dspark import DSparkDrafter
from .data import Sequences
from .heads import teacher_forced_bias, teacher_forced_prev
from .loss import IGNORE, block_inputs, block_labels, block_mask, sample_anchors

__all__ = ["AcceptanceReport", "accept_lengths", "block_states", "cluster_mean_se", "draft_blocks",
           "teacher_forced_acceptance"]


def accept_lengths(drafts: Tensor, labels: Tensor) -> Tensor:
    """``1 + leading matches`` per block: drafts ``[..., B-1]`` vs labels ``[..., B-1]``
    (`IGNORE` past the end of the response, which ends the run). Returns ``[...]`` long."""
    match = (drafts == labels) & (labels != IGNORE)
    return 1 + match.long().cumprod(-1).sum(-1)


def cluster_mean_se(values: Tensor, clusters: Tensor) -> tuple[float, float]:
    """Mean of ``values`` ``[n]`` and its cluster-robust SE (clusters ``[n]`` long ids)."""
    n = values.numel()
    if n == 0:
        return math.nan, math.nan
    v = values.double()
    m = float(v.mean())
    ids, inv = torch.unique(clusters, return_inverse=True)
    g = ids.numel()
    if g < 2:
        return m, math.nan
    resid = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, v - m)
    return m, math.sqrt(g / (g - 1) * float((resid ** 2).sum())) / n


@dataclass
class AcceptanceReport:
    """Per-anchor results and their summaries (see the module docstring)."""

    lengths: Tensor  # [n] long, acceptance length of each anchor's block (1..B)
    sequence: Tensor  # [n] long, the held-out sequence of each anchor
    groups: list[str]  # [n], its prompt group
    slot_hits: Tensor  # [n, B-1] bool, slots 1..k all accepted (the round reaches past slot k)
    head: str = "full"  # "full" or "top<K>"
    extra: dict[str, Any] = field(default_factory=dict)

    def mean_se(self, group: str | None = None) -> tuple[float, float]:
        keep = torch.tensor([group is None or g == group for g in self.groups], dtype=torch.bool)
        return cluster_mean_se(self.lengths[keep].float(), self.sequence[keep])

    @property
    def balanced(self) -> tuple[float, float]:
        """Mean of the group means, and its SE (groups are disjoint sets of sequences)."""
        stats = [self.mean_se(g) for g in sorted(set(self.groups))]
        m = sum(s[0] for s in stats) / len(stats)
        return m, math.sqrt(sum(s[1] ** 2 for s in stats)) / len(stats)

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary: balanced mean/SE (the headline), the plain mean over all
        anchors, per group, the first-draft acceptance and the share reaching each slot."""
        bal, bal_se = self.balanced
        mean, se = self.mean_se()
        reach = self.slot_hits.float().mean(0)  # P(slots 1..k all accepted)
        out = {"accept": bal, "accept_se": bal_se, "accept_all": mean, "accept_all_se": se,
               "anchors": int(self.lengths.numel()), "sequences": int(torch.unique(self.sequence).numel()),
               "first_draft_accepted": float(self.slot_hits[:, 0].float().mean()),
               "accepted_through_slot": [round(float(x), 5) for x in reach], "head": self.head,
               "groups": {}}
        for g in sorted(set(self.groups)):
            m, s = self.mean_se(g)
            out["groups"][g] = {"accept": m, "accept_se": s, "anchors": sum(x == g for x in self.groups)}
        return {**out, **self.extra}


def block_states(drafter: DFlashDrafter, embed: nn.Module, ids: Tensor, feats: Tensor,
                 anchors: Tensor) -> tuple[Tensor, Tensor]:
    """The drafter's hidden states of the blocks anchored at ``anchors``, as a decoding round
    anchored there computes them: ``ids [bs, T]``, ``feats [bs, T, K*H]``, ``anchors [bs, N]``
    (``-1``: padding) -> hidden ``[bs, N, B, H]`` (after the final norm; slot 0 is the anchor's)
    and the anchors' tokens ``[bs, N]``. Every block sees the features strictly before its
    anchor and itself (`block_mask`)."""
    dev = drafter.fc.weight.device
    ids, feats, anchors = ids.to(dev), feats.to(dev), anchors.to(dev)
    bs, width = ids.shape
    context = drafter.project_context(feats, torch.arange(width, device=dev).expand(bs, width))
    q_ids, q_pos = block_inputs(ids, anchors, drafter.block_size, drafter.mask_token_id)
    hidden = drafter(embed(q_ids), q_pos, context, block_mask(anchors, width, drafter.block_size))
    return (hidden.view(bs, anchors.shape[1], drafter.block_size, -1),
            q_ids.view(bs, -1, drafter.block_size)[:, :, 0])


@torch.no_grad()
def draft_blocks(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, ids: Tensor, feats: Tensor,
                 anchors: Tensor, head_ids: Tensor | None = None, labels: Tensor | None = None) -> Tensor:
    """The drafts a decoding round anchored at each of ``anchors`` would make.

    ``ids [bs, T]``, ``feats [bs, T, K*H]`` (the target's features of the sequence),
    ``anchors [bs, N]`` (``-1``: padding). Every block sees the features strictly
    before its anchor and itself (`block_mask`), as in a round of decoding. Returns
    ``[bs, N, B-1]`` long target ids (``head_ids[argmax]`` for a reduced head).

    With ``labels`` (``[bs, N, B-1]``, `block_labels`) only the slots a round reaches
    get the head (slot ``k`` where slots ``1..k-1`` all matched): about ``tau`` head rows
    per block instead of ``B-1``. The other slots read ``-1`` (never a match).

    A family head (DSpark's Markov head, Domino's GRU) adds a bias from the earlier drafts.
    Without ``labels`` its own rollout drafts every slot; with them the bias is teacher-forced
    (`heads.teacher_forced_bias`), which is exact: a slot is reached only when every earlier
    draft equalled its label, so the drafted previous tokens *are* the labels (Domino's
    candidate pool aside: the teacher-forced correction scores every row)."""
    dev = drafter.fc.weight.device
    blocks, anchor_ids = block_states(drafter, embed, ids, feats, anchors)
    anchors = anchors.to(dev)
    hidden = blocks[:, :, 1:]
    if isinstance(drafter, DSparkDrafter) and drafter.dspark.sample_from_anchor:
        raise ValueError("teacher-forced acceptance scores DFlash's query layout; this DSpark drafter samples "
                         "from the anchor's slot (sample_from_anchor = true)")
    if isinstance(drafter, DominoDrafter) and drafter.domino.shift_label:
        raise ValueError("teacher-forced acceptance scores DFlash's query layout; this Domino drafter reads "
                         "its proposals from slot 0 (shift_label = true)")
    mapped = (lambda x: x) if head_ids is None else (lambda x: head_ids.to(dev)[x])  # noqa: E731
    if labels is None:
        if drafter.family != "dflash":  # the family head's own rollout
            return drafter.head.rollout(blocks, anchor_ids, embed_tokens=embed, lm_head=head,
                                        num_drafts=drafter.block_size - 1)
        # every slot, in one 2-D GEMM (a 4-D input takes a slower batched path)
        return mapped(head(hidden.reshape(-1, hidden.shape[-1])).argmax(-1)).view(hidden.shape[:-1])
    labels = labels.to(dev)
    n = hidden.shape[2]
    bias = teacher_forced_bias(drafter, embed, hidden.reshape(-1, n, hidden.shape[-1]),
                               teacher_forced_prev(anchor_ids, labels).reshape(-1, n), head_ids)
    bias = None if bias is None else bias.view(*labels.shape, -1)
    drafts = torch.full(hidden.shape[:-1], -1, dtype=torch.long, device=dev)
    live = anchors >= 0  # [bs, N]: blocks whose slots so far all matched
    for k in range(hidden.shape[2]):
        if not bool(live.any()):
            break
        logits = head(hidden[:, :, k][live])
        if bias is not None:  # summed in float32 and rounded to the step dtype, as DSpark's rollout does
            step = torch.promote_types(logits.dtype, bias.dtype)
            logits = (logits.float() + bias[:, :, k][live].float()).to(step)
        drafts[:, :, k][live] = mapped(logits.argmax(-1))
        live = live & (drafts[:, :, k] == labels[:, :, k]) & (labels[:, :, k] != IGNORE)
    return drafts


@torch.no_grad()
def teacher_forced_acceptance(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, data: Sequences,
                              indices: Sequence[int], groups: Sequence[str], *, anchors_per_seq: int = 8,
                              max_offset: int | None = 95, seed: int = 0, batch_seqs: int = 16,
                              head_ids: Tensor | None = None) -> AcceptanceReport:
    """Score ``drafter`` on anchors of the sequences ``indices`` of ``data`` (their prompt
    groups in ``groups``, same length).

    ``head`` maps drafter hidden states to logits: the target's ``lm_head`` (``[V]``), or
    a reduced head over ``head_ids`` (``[K]`` target ids, e.g. `DraftVocabHead`), whose
    argmax row is mapped back to a target id. Anchors: per sequence ``anchors_per_seq``
    distinct response positions below ``max_offset`` (None: anywhere), drawn from a
    generator seeded with ``seed`` in the order of ``indices``."""
    if len(indices) != len(groups):
        raise ValueError(f"indices ({len(indices)}) and groups ({len(groups)}) must have the same length")
    if len(indices) == 0:
        raise ValueError("teacher_forced_acceptance: no held-out sequences")
    was_training = drafter.training
    drafter.eval()
    dev = drafter.fc.weight.device
    gen = torch.Generator().manual_seed(seed)
    lengths, seq_of, grp_of, hits = [], [], [], []
    for s in range(0, len(indices), batch_seqs):
        chunk = list(indices[s: s + batch_seqs])
        ids, feats, lens, plens = data.batch(chunk, dtype=drafter.fc.weight.dtype)
        anchors = sample_anchors(plens, lens, anchors_per_seq, gen, max_offset=max_offset).to(dev)
        ids = ids.to(dev)
        bs = ids.shape[0]
        labels = block_labels(ids, anchors, lens.to(dev), drafter.block_size)
        drafts = draft_blocks(drafter, embed, head, ids, feats, anchors, head_ids, labels=labels)
        valid = anchors >= 0
        lengths.append(accept_lengths(drafts, labels)[valid].cpu())
        hits.append(((drafts == labels) & (labels != IGNORE)).long().cumprod(-1).bool()[valid].cpu())
        rows = torch.arange(bs, device=dev)[:, None].expand_as(anchors)[valid].cpu()
        seq_of.append(torch.tensor(chunk)[rows])
        grp_of += [groups[s + int(r)] for r in rows]
    drafter.train(was_training)
    name = "full" if head_ids is None else f"top{head_ids.numel()}"
    return AcceptanceReport(torch.cat(lengths), torch.cat(seq_of), grp_of, torch.cat(hits), head=name)
