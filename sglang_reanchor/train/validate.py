"""``train validate``: teacher-forced acceptance of drafter folders, side by side.

Every drafter is scored on the same held-out anchors (`acceptance.py`, seed 0), with
the reduced draft-vocabulary head (top ``K`` of each folder's ranking, how a drafter
trained with ``--draft-vocab K`` decodes: ``draft_vocab=K``) and/or the full head.
Beside each drafter's mean +- SE, the paired difference against the first drafter:
per sequence the difference of the acceptance sums, so the SE is that of the
difference (the anchors are shared), usually far smaller than either drafter's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..drafter import DFlashDrafter
from ..drafter.draft_vocab import DraftVocabHead, top_tokens
from .acceptance import AcceptanceReport, cluster_mean_se, teacher_forced_acceptance
from .data import load_sequences
from .selection import group_folders

__all__ = ["Validator", "paired_difference", "validate_drafters"]


class Validator:
    """Teacher-forced block acceptance during `fit`, on a held-out data folder (fixed
    anchors; `acceptance.py`) with the head the run trains (full or reduced): the log
    fields ``val_accept`` (+- ``val_accept_se``, the balanced mean), ``val_accept_all``,
    ``val_first_draft``, ``val_groups`` ({group: [mean, se]})."""

    def __init__(self, val_dir: str | Path, settings: Any) -> None:
        self.data = load_sequences(val_dir)
        self.groups = group_folders([val_dir])
        self.anchors, self.max_offset = settings.val_anchors, settings.val_max_offset

    def __call__(self, trainer: Any) -> dict[str, Any]:
        """Score ``trainer.drafter`` with ``trainer.head`` / ``trainer.head_ids``."""
        report = teacher_forced_acceptance(
            trainer.drafter, trainer.embed, trainer.head, self.data, list(range(len(self.data))), self.groups,
            anchors_per_seq=self.anchors, max_offset=self.max_offset, seed=0, head_ids=trainer.head_ids)
        summary = report.summary()
        return {"val_accept": summary["accept"], "val_accept_se": summary["accept_se"],
                "val_accept_all": summary["accept_all"], "val_accept_all_se": summary["accept_all_se"],
                "val_first_draft": summary["first_draft_accepted"], "val_anchors": summary["anchors"],
                "val_head": summary["head"],
                "val_groups": {g: [round(v["accept"], 4), round(v["accept_se"], 4)]
                               for g, v in summary["groups"].items()}}


def paired_difference(a: AcceptanceReport, b: AcceptanceReport) -> tuple[float, float]:
    """Balanced (mean of group means) difference ``a - b`` on shared anchors, and its SE."""
    if not torch.equal(a.sequence, b.sequence) or a.groups != b.groups:
        raise ValueError("paired_difference: the two reports must score the same anchors")
    diffs, ses = [], []
    for g in sorted(set(a.groups)):
        keep = torch.tensor([x == g for x in a.groups])
        m, s = cluster_mean_se((a.lengths[keep] - b.lengths[keep]).float(), a.sequence[keep])
        diffs.append(m)
        ses.append(s)
    return sum(diffs) / len(diffs), math.sqrt(sum(s * s for s in ses)) / len(ses)


def validate_drafters(target: PreTrainedModel, drafters: Sequence[str | Path], val_data: str | Path,
                      out: str | Path, *, draft_vocab: int | None = 8192, anchors_per_seq: int = 8,
                      max_offset: int | None = 95, full_head: bool = False) -> dict[str, Any]:
    """Score each folder of ``drafters`` on ``val_data``; write and return the JSON report
    ``{"drafters": {name: {head: summary}}, "paired": [...], "settings": ...}``."""
    heads = ([f"top{draft_vocab}"] if draft_vocab else []) + (["full"] if full_head else [])
    if not heads:
        raise ValueError("validate_drafters: choose a reduced head (draft_vocab > 0) and/or full_head=True")
    data = load_sequences(val_data)
    groups = group_folders([val_data])
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    reports: dict[str, dict[str, AcceptanceReport]] = {}
    names = []
    for folder in drafters:
        drafter = DFlashDrafter.from_pretrained(folder, dtype=torch.float32).eval()
        name = Path(folder).name if Path(folder).name not in names else str(folder)
        names.append(name)
        reports[name] = {}
        for head in heads:
            if head == "full":
                h, ids = lm_head, None
            else:
                if drafter.vocab_ranking is None:
                    raise ValueError(f"{folder}: no draft_vocab.safetensors for the top-{draft_vocab} head")
                ids = top_tokens(drafter.vocab_ranking, draft_vocab, str(folder))
                h = DraftVocabHead(lm_head, ids)
            reports[name][head] = teacher_forced_acceptance(
                drafter, embed, h, data, list(range(len(data))), groups, anchors_per_seq=anchors_per_seq,
                max_offset=max_offset, seed=0, head_ids=ids)
    base = names[0]
    paired = []
    for name in names[1:]:
        for head in heads:
            d, se = paired_difference(reports[name][head], reports[base][head])
            paired.append({"drafter": name, "baseline": base, "head": head, "diff": d, "diff_se": se})
    result = {"drafters": {n: {h: r.summary() for h, r in hs.items()} for n, hs in reports.items()},
              "paired": paired, "folders": [str(f) for f in drafters],
              "settings": {"val_data": str(val_data), "sequences": len(data), "anchors_per_seq": anchors_per_seq,
                           "max_offset": max_offset, "seed": 0, "heads": heads}}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return result
