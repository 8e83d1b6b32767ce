"""DSpark's confidence head: trained on teacher-forced acceptance, measured as a verify-length signal.

The confidence head (`drafter.dspark.DSparkConfidenceHead`, one ``Linear`` as in SGLang)
reads a proposal slot's hidden state and the Markov embedding of the token before it and
predicts the chance that the slot's draft is accepted once every earlier draft was: the
product over slots ``1..k`` is then the chance a round reaches past slot ``k``, which is
what SGLang's DSPARK uses to choose how many drafts to verify.

Its target is teacher-forced, like the rest of the training (`heads.py`): at slot ``k``
the earlier tokens are the true ``x[a + 1 .. a + k - 1]`` and the label says whether the
draft equals ``x[a + k]``. That is exactly the conditional the product needs: a slot is
reached only when every earlier draft was right, and then the drafted earlier tokens are
the true ones.

- `slot_examples`: per block anchored as decoding anchors it (`acceptance.block_states`),
  per slot the head's input features, whether the draft is right, and the drafter's own
  probability of its draft (the free signal a confidence head has to beat);
- `fit_confidence_head`: the binary cross-entropy, full batch, L-BFGS, with the backbone
  and the Markov head frozen (the head is ``H + r + 1`` numbers);
- `verify_length_curve`: on held-out blocks, drafts accepted per round against drafts
  verified per round when the verified depth is a fixed cap, or is cut where the running
  product of the confidence (or of the draft probability) falls below a threshold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..drafter.dspark import DSparkConfidenceHead, DSparkDrafter
from .acceptance import block_states, cluster_mean_se
from .data import Sequences
from .heads import teacher_forced_bias, teacher_forced_prev
from .loss import IGNORE, block_labels, sample_anchors

__all__ = ["SlotExamples", "confidence_of", "confidence_report", "fit_confidence_head", "roc_auc", "slot_examples",
           "verify_length_curve", "with_confidence_head"]


@dataclass
class SlotExamples:
    """Every proposal slot of ``R`` blocks (``n`` slots each), teacher-forced."""

    features: Tensor  # [R, n, F] float32: what the confidence head reads (F = H + r with the Markov embedding)
    correct: Tensor  # [R, n] bool: the draft equals the true token (the earlier ones true)
    valid: Tensor  # [R, n] bool: the slot has a true token (a block cut by the response's end has fewer)
    draft_prob: Tensor  # [R, n] float32: the drafter's softmax probability of its draft
    sequence: Tensor  # [R] long: the held-out sequence of each block (for cluster-robust SEs)
    groups: list[str]  # [R]: its prompt group

    @property
    def accepted(self) -> Tensor:
        """Drafts a round anchored at each block accepts (leading right drafts) ``[R]`` long."""
        return (self.correct & self.valid).long().cumprod(-1).sum(-1)

    @property
    def reached(self) -> Tensor:
        """``[R, n]`` bool: the round gets to the slot (every earlier draft right)."""
        ok = (self.correct & self.valid).long().cumprod(-1)
        return torch.cat([torch.ones_like(ok[:, :1]), ok[:, :-1]], dim=-1).bool() & self.valid


def with_confidence_head(drafter: DSparkDrafter, with_markov: bool = True) -> DSparkDrafter:
    """Give ``drafter`` (in place) a fresh confidence head (``proj`` zero: every slot 0.5) and
    ``enable_confidence_head: true``, so `save_pretrained` writes a folder SGLang's DSpark loads
    with its dynamic verify length. Returns ``drafter``."""
    if not isinstance(drafter, DSparkDrafter):
        raise ValueError(f"a confidence head belongs to a DSpark drafter; this is a {drafter.family_name} one")
    h, r = drafter.config.hidden_size, drafter.dspark.markov_rank
    head = DSparkConfidenceHead(h, r, with_markov).to(device=drafter.fc.weight.device, dtype=drafter.fc.weight.dtype)
    nn.init.zeros_(head.proj.weight)
    nn.init.zeros_(head.proj.bias)
    drafter.dspark = dataclasses.replace(drafter.dspark, confidence_head=True, confidence_head_with_markov=with_markov)
    drafter.confidence_head = head
    drafter.head.confidence_head = head
    return drafter


@torch.no_grad()
def slot_examples(drafter: DSparkDrafter, embed: nn.Module, head: nn.Module, data: Sequences,
                  indices: Sequence[int], groups: Sequence[str], *, anchors_per_seq: int = 8,
                  max_offset: int | None = 95, seed: int = 0, batch_seqs: int = 16,
                  head_ids: Tensor | None = None, progress: Any = None) -> SlotExamples:
    """The slots of blocks anchored on the sequences ``indices`` of ``data`` (prompt groups
    ``groups``), drawn as `acceptance.teacher_forced_acceptance` draws them (same ``seed``,
    same anchors). ``head``: the target's LM head or a reduced one over ``head_ids`` (the rows
    the drafter decodes with). ``drafter`` needs a confidence head (`with_confidence_head`):
    its flag ``with_markov`` sets the features. ``progress``: called with the sequences done."""
    if drafter.confidence_head is None:
        raise ValueError("slot_examples: the drafter has no confidence head; add one with with_confidence_head")
    if drafter.dspark.sample_from_anchor:
        raise ValueError("slot_examples scores DFlash's query layout (sample_from_anchor = false)")
    if len(indices) != len(groups):
        raise ValueError(f"indices ({len(indices)}) and groups ({len(groups)}) must have the same length")
    was_training = drafter.training
    drafter.eval()
    dev = drafter.fc.weight.device
    gen = torch.Generator().manual_seed(seed)
    n = drafter.block_size - 1
    # filled in place, allocated once: batch-sized pieces kept between large temporaries
    # fragment the heap into many times their size
    most = len(indices) * anchors_per_seq
    width = drafter.config.hidden_size + (drafter.dspark.markov_rank if drafter.confidence_head.with_markov else 0)
    out = SlotExamples(torch.empty(most, n, width), torch.empty(most, n, dtype=torch.bool),
                       torch.empty(most, n, dtype=torch.bool), torch.empty(most, n), torch.empty(most, dtype=torch.long),
                       [])
    r = 0
    for s in range(0, len(indices), batch_seqs):
        chunk = list(indices[s: s + batch_seqs])
        ids, feats, lens, plens = data.batch(chunk, dtype=drafter.fc.weight.dtype)
        anchors = sample_anchors(plens, lens, anchors_per_seq, gen, max_offset=max_offset).to(dev)
        labels = block_labels(ids.to(dev), anchors, lens.to(dev), drafter.block_size)
        blocks, anchor_ids = block_states(drafter, embed, ids, feats, anchors)
        keep = anchors >= 0
        slots = blocks[:, :, 1:][keep]  # [R, n, H]
        labels, prev = labels[keep], teacher_forced_prev(anchor_ids, labels)[keep]
        logits = head(slots.reshape(-1, slots.shape[-1])).float().view(*labels.shape, -1)
        logits += teacher_forced_bias(drafter, embed, slots, prev, head_ids).float()
        prob, choice = logits.softmax(-1).max(-1)
        drafts = choice if head_ids is None else head_ids.to(dev)[choice]
        rows = slice(r, r + labels.shape[0])
        out.features[rows] = drafter.head.confidence_features(slots, prev).float().cpu()
        out.correct[rows] = (drafts == labels).cpu()
        out.valid[rows] = (labels != IGNORE).cpu()
        out.draft_prob[rows] = prob.cpu()
        seq = torch.arange(len(chunk), device=dev)[:, None].expand_as(anchors)[keep].cpu()
        out.sequence[rows] = torch.tensor(chunk)[seq]
        out.groups += [groups[s + int(i)] for i in seq]
        r += labels.shape[0]
        if progress is not None:
            progress(len(chunk))
    drafter.train(was_training)
    return SlotExamples(out.features[:r], out.correct[:r], out.valid[:r], out.draft_prob[:r], out.sequence[:r],
                        out.groups)


def fit_confidence_head(drafter: DSparkDrafter, examples: SlotExamples, *, l2: float = 1e-4,
                        max_iter: int = 200) -> dict[str, float]:
    """Fit ``drafter.confidence_head`` on ``examples`` (its valid slots, every one weighted
    alike): binary cross-entropy plus ``l2`` times the squared weights (not the bias), full
    batch, L-BFGS in float32. Returns ``{"loss", "bce", "slots"}`` at the end."""
    if drafter.confidence_head is None:
        raise ValueError("fit_confidence_head: the drafter has no confidence head (with_confidence_head)")
    x = examples.features[examples.valid]
    y = examples.correct[examples.valid].float()
    if y.numel() == 0:
        raise ValueError("fit_confidence_head: no valid slots to fit on")
    proj = drafter.confidence_head.proj
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.full((1,), math.log((y.mean() + 1e-6) / (1 - y.mean() + 1e-6)), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-9,
                            tolerance_change=1e-12, history_size=20)

    def objective() -> Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(objective)
    with torch.no_grad():
        bce = float(F.binary_cross_entropy_with_logits(x @ w + b, y))
        proj.weight.copy_(w[None].to(proj.weight.dtype))
        proj.bias.copy_(b.to(proj.bias.dtype))
        loss = bce + l2 * float((w * w).sum())
    return {"loss": loss, "bce": bce, "slots": int(y.numel())}


@torch.no_grad()
def confidence_of(drafter: DSparkDrafter, examples: SlotExamples) -> Tensor:
    """The confidence head's per-slot acceptance estimate on ``examples`` ``[R, n]`` float32."""
    if drafter.confidence_head is None:
        raise ValueError("confidence_of: the drafter has no confidence head")
    proj = drafter.confidence_head.proj
    return torch.sigmoid(F.linear(examples.features, proj.weight.float(), proj.bias.float()).squeeze(-1))


def roc_auc(score: Tensor, label: Tensor) -> float:
    """Area under the ROC curve of ``score`` for the boolean ``label`` (ties count half)."""
    pos, neg = int(label.sum()), int((~label).sum())
    if pos == 0 or neg == 0:
        return math.nan
    # Mann-Whitney: mean rank of the positives, ties given their average rank
    order = torch.argsort(score.double())
    _, inverse, counts = torch.unique_consecutive(score.double()[order], return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts + 1  # the rank of each run of ties' first member
    ranks = torch.empty(score.numel(), dtype=torch.float64)
    ranks[order] = (first + (counts - 1) / 2.0).double()[inverse]
    return float((ranks[label].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def _cut_depth(signal: Tensor, valid: Tensor, threshold: float, min_depth: int) -> Tensor:
    """Drafts verified per block ``[R]``: the leading slots whose running product of ``signal``
    stays at or above ``threshold``, at least ``min_depth``, at most the valid slots."""
    run = torch.cumprod(signal, dim=-1) >= threshold
    depth = run.long().cumprod(-1).sum(-1)
    return torch.minimum(depth.clamp(min=min_depth), valid.long().sum(-1))


def verify_length_curve(examples: SlotExamples, signals: dict[str, Tensor], *, min_depth: int = 1,
                        thresholds: Sequence[float] = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.07,
                                                       0.05, 0.03, 0.02, 0.01, 0.005, 0.0)) -> dict[str, Any]:
    """Accepted against verified drafts per round on ``examples``, for a fixed depth cap
    (1 .. n) and, for each ``signals[name]`` (``[R, n]`` per-slot acceptance estimates), a
    cut where the running product falls below each of ``thresholds``. A round accepts
    ``min(leading right drafts, verified)``. Each point: ``{"verified", "accepted",
    "accepted_se"}`` (means per block, SE cluster-robust by sequence); ``"matched"`` gives,
    per signal and per fixed cap ``d``, the accepted drafts of the signal's curve at the
    fixed cap's verified count (linear between its points) minus the fixed cap's, and what
    fraction of the fixed cap's verified drafts the signal needs for the fixed cap's
    accepted drafts."""
    accepted = examples.accepted
    valid = examples.valid
    n = valid.shape[1]

    def point(depth: Tensor) -> dict[str, float]:
        got = torch.minimum(accepted, depth).float()
        m, se = cluster_mean_se(got, examples.sequence)
        return {"verified": float(depth.float().mean()), "accepted": m, "accepted_se": se}

    fixed = [point(torch.minimum(torch.full_like(accepted, d), valid.long().sum(-1))) for d in range(1, n + 1)]
    curves = {name: [{"threshold": t, **point(_cut_depth(sig, valid, t, min_depth))} for t in thresholds]
              for name, sig in signals.items()}
    matched: dict[str, list[dict[str, float]]] = {}
    for name, curve in curves.items():
        pts = sorted({(p["verified"], p["accepted"]) for p in curve})
        vx = torch.tensor([p[0] for p in pts], dtype=torch.float64)
        ay = torch.tensor([p[1] for p in pts], dtype=torch.float64)
        rows = []
        for d, f in enumerate(fixed, start=1):
            rows.append({"cap": d, "fixed_verified": f["verified"], "fixed_accepted": f["accepted"],
                         "accepted_gain": _interp(f["verified"], vx, ay) - f["accepted"],
                         "verified_ratio": _interp(f["accepted"], ay, vx) / f["verified"]})
        matched[name] = rows
    return {"fixed": fixed, "curves": curves, "matched": matched, "blocks": int(accepted.numel()),
            "min_depth": min_depth}


def _interp(x: float, xs: Tensor, ys: Tensor) -> float:
    """``ys`` at ``x`` on the piecewise-linear curve through ``(xs, ys)`` (sorted by ``xs``;
    nan outside it)."""
    order = torch.argsort(xs)
    xs, ys = xs[order], ys[order]
    if x < float(xs[0]) or x > float(xs[-1]):
        return math.nan
    i = int(torch.searchsorted(xs, torch.tensor([x], dtype=xs.dtype)).item())
    if i == 0 or float(xs[i if i < len(xs) else -1]) == x:
        return float(ys[min(i, len(ys) - 1)])
    x0, x1, y0, y1 = float(xs[i - 1]), float(xs[i]), float(ys[i - 1]), float(ys[i])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def confidence_report(drafter: DSparkDrafter, embed: nn.Module, head: nn.Module,
                      train: tuple[Sequences, list[str]], val: tuple[Sequences, list[str]], *,
                      sequences: int = 4096, anchors_per_seq: int = 8, max_offset: int | None = 95,
                      head_ids: Tensor | None = None, with_markov: bool = True, l2: float = 1e-4,
                      seed: int = 0) -> dict[str, Any]:
    """Give ``drafter`` a confidence head fitted on ``sequences`` random sequences of ``train``
    (data, groups) and measure it on every sequence of ``val``, beside the drafter's own draft
    probability: the JSON-able report ``{"fit", "val", "settings"}``. ``val["curve"]`` is
    `verify_length_curve`, ``val["auc_reached"]`` the AUC of each signal on the slots rounds reach."""
    data, groups = train
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:sequences].sort().values.tolist()
    with_confidence_head(drafter, with_markov)
    collected = {}
    for name, (d, g, idx, s) in {"train": (data, groups, pick, seed + 1),
                                 "val": (val[0], val[1], list(range(len(val[0]))), 0)}.items():
        with tqdm(total=len(idx), desc=f"{name} blocks", unit="seq") as bar:
            collected[name] = slot_examples(drafter, embed, head, d, idx, [g[i] for i in idx],
                                            anchors_per_seq=anchors_per_seq, max_offset=max_offset, seed=s,
                                            head_ids=head_ids, progress=bar.update)
    fitted = fit_confidence_head(drafter, collected["train"], l2=l2)
    ex = collected["val"]
    signals = {"confidence": confidence_of(drafter, ex), "draft_prob": ex.draft_prob}
    reached = ex.reached
    return {
        "fit": {**fitted, "blocks": int(collected["train"].accepted.numel())},
        "val": {"blocks": int(ex.accepted.numel()), "slots_reached": int(reached.sum()),
                "auc_reached": {k: roc_auc(v[reached], ex.correct[reached]) for k, v in signals.items()},
                "mean_confidence_reached": float(signals["confidence"][reached].mean()),
                "accept_rate_reached": float(ex.correct[reached].float().mean()),
                "curve": verify_length_curve(ex, signals)},
        "settings": {"sequences": len(pick), "anchors_per_seq": anchors_per_seq, "max_offset": max_offset,
                     "draft_vocab": None if head_ids is None else int(head_ids.numel()),
                     "with_markov": with_markov, "l2": l2, "seed": seed, "train_anchor_seed": seed + 1,
                     "val_anchor_seed": 0},
    }
