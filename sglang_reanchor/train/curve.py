"""The training curve of one `fit` run: its validations against the labelled slots seen.

``curve.json`` holds every validation (step, labelled slots seen, elapsed seconds; the
teacher-forced acceptance with its standard error and per-group figures, and/or the
generation tau of the held-out prompts) and the training loss by 100 steps;
``curve.png`` draws the teacher-forced acceptance with +-1 SE error bars (and the
generation tau where the log has it) against the labelled slots seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .plots import save_tau_figure

__all__ = ["training_curve"]

_POINT_KEYS = ("step", "labels_seen", "elapsed", "val_tau", "val_accept", "val_accept_se", "val_accept_all",
               "val_accept_all_se", "val_first_draft", "val_anchors", "val_head", "val_groups", "epochs")


def training_curve(log: str | Path, out_dir: str | Path, title: str = "") -> dict[str, Any]:
    """Write ``curve.json`` and ``curve.png`` for a `fit` log into ``out_dir``; returns the JSON object."""
    recs = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    points = [{k: r[k] for k in _POINT_KEYS if k in r} for r in recs
              if ("val_tau" in r or "val_accept" in r) and not r.get("final")]
    final = next((r for r in reversed(recs) if "final_val_tau" in r or r.get("final")), None)
    losses = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    curve = {"title": title, "points": points, "final": final,
             "loss_by_100_steps": [[chunk[-1][0], sum(v for _, v in chunk) / len(chunk)]
                                   for chunk in (losses[i: i + 100] for i in range(0, len(losses), 100))]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    accept = [p for p in points if "val_accept" in p]
    taus = [p for p in points if "val_tau" in p]

    def draw(ax) -> None:
        if accept:
            head = accept[-1].get("val_head", "")
            ax.errorbar([p.get("labels_seen", 0) / 1e6 for p in accept], [p["val_accept"] for p in accept],
                        yerr=[p.get("val_accept_se", 0.0) for p in accept], marker="o", capsize=3,
                        label=f"teacher-forced, {accept[-1].get('val_anchors', '?')} held-out anchors ({head}), +-1 SE")
        if taus:
            ax.plot([p.get("labels_seen", 0) / 1e6 for p in taus], [p["val_tau"] for p in taus], marker="s",
                    ls=":", label="generation tau (held-out prompts, subset)")
        if final is not None and "final_val_tau" in final:
            ax.scatter([final.get("labels_seen", 0) / 1e6], [final["final_val_tau"]], color="C3", zorder=3,
                       label=f"final tau, all {final.get('num_val_prompts', '?')} prompts")
        if final is not None and "final_val_accept" in final:
            ax.errorbar([final.get("labels_seen", 0) / 1e6], [final["final_val_accept"]],
                        yerr=[final.get("final_val_accept_se", 0.0)], color="C3", marker="D", capsize=3,
                        label="final teacher-forced")

    save_tau_figure(out / "curve.png", draw, xlabel="labelled draft slots trained on (millions)",
                    title=title or "drafter validation", ylabel="acceptance length per round")
    return curve
