"""The data learning curve: drafter acceptance length against training data.

Each point is one trained drafter: the response tokens it was trained on, the labelled
draft slots it saw, and a benchmark run of it (``python -m sglang_reanchor.bench ...
--methods dflash``, its ``results.json``). The tau of a point is read from that stored
run (``summary["all"]["dflash"]["tau"]``, the per-dataset mean the benchmark reports),
never typed in.

Each point carries a standard error, drawn as an error bar. For a benchmark run it is
the sampling error of that tau given its prompts: per response the variance of its
rounds' taus over their count, combined through the two means (over a dataset's
responses, then over datasets). A point may instead be a ``train validate`` report (its
``"drafters"`` key): the teacher-forced acceptance of the drafter named like the point
(or the first), first head listed, with its cluster-robust SE.

The trend is the least-squares line ``tau = a + b * ln(tokens)``. It says where the
curve is heading, and how much data the line would need to reach a goal
(``tokens = exp((goal - a) / b)``): a projection of the measured points, not a
measurement. Few points and a short range make it rough; the report says so by
giving the points beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .plots import save_tau_figure

__all__ = ["CurvePoint", "benchmark_tau_se", "fit_log_line", "learning_curve", "read_point"]


@dataclass(frozen=True)
class CurvePoint:
    name: str
    response_tokens: int  # distinct target-response tokens in its training data
    labels_seen: int | None  # labelled draft slots trained on (summed over chained runs); None: not recorded
    tau: float  # DFlash acceptance length on the run's prompts
    source: str  # the results.json it was read from
    tau_se: float | None = None  # its standard error (None: not computable from the file)
    kind: str = "benchmark"  # "benchmark" (generation tau) or "teacher-forced" (a `train validate` report)


def benchmark_tau_se(records: Sequence[dict[str, Any]], method: str = "dflash") -> float | None:
    """SE of a benchmark run's ``"all"`` tau (the mean over datasets of the mean over
    responses of each response's mean round tau), given its prompts: see the module
    docstring. None when no record of ``method`` has rounds."""
    by_dataset: dict[str, list[float]] = {}
    for r in records:
        taus = r.get("taus") or []
        if r.get("method") != method or not taus:
            continue
        m = sum(taus) / len(taus)
        var = sum((t - m) ** 2 for t in taus) / (len(taus) - 1) / len(taus) if len(taus) > 1 else 0.0
        by_dataset.setdefault(r["dataset"], []).append(var)
    if not by_dataset:
        return None
    dataset_vars = [sum(v) / len(v) ** 2 for v in by_dataset.values()]
    return math.sqrt(sum(dataset_vars)) / len(dataset_vars)


def read_point(name: str, response_tokens: int, labels_seen: int | None, results_json: str | Path,
               method: str = "dflash") -> CurvePoint:
    """A point whose tau is the ``"all"`` mean of ``method`` in a stored benchmark run,
    or the teacher-forced acceptance of drafter ``name`` in a ``train validate`` report."""
    doc = json.loads(Path(results_json).read_text())
    labels = None if labels_seen is None else int(labels_seen)
    if "drafters" in doc:  # a `train validate` report
        drafters = doc["drafters"]
        if not drafters:
            raise ValueError(f"{results_json}: the validate report holds no drafter")
        heads = drafters.get(name) or next(iter(drafters.values()))
        head = next(iter(heads.values()))
        return CurvePoint(name, int(response_tokens), labels, float(head["accept"]), str(results_json),
                          float(head["accept_se"]), "teacher-forced")
    try:
        tau = float(doc["summary"]["all"][method]["tau"])
    except KeyError as e:
        raise ValueError(f"{results_json}: no summary['all'][{method!r}]['tau'] (run the benchmark with "
                         f"--methods {method})") from e
    return CurvePoint(name, int(response_tokens), labels, tau, str(results_json),
                      benchmark_tau_se(doc.get("records", []), method))


def fit_log_line(tokens: Sequence[float], taus: Sequence[float]) -> tuple[float, float]:
    """Least squares ``tau = a + b * ln(tokens)``; returns ``(a, b)``. Needs two or more
    distinct token counts."""
    if len(tokens) != len(taus):
        raise ValueError(f"fit_log_line: {len(tokens)} token counts but {len(taus)} taus")
    xs = [math.log(t) for t in tokens]
    n = len(xs)
    mx, my = sum(xs) / max(n, 1), sum(taus) / max(n, 1)
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        raise ValueError("fit_log_line: needs at least two points with different token counts")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, taus)) / sxx
    return my - b * mx, b


def learning_curve(points: Sequence[CurvePoint], out_dir: str | Path, goal: float = 3.0,
                   title: str = "") -> dict[str, Any]:
    """Write ``learning_curve.json`` (points, fitted line, the tokens the line needs for
    ``goal``) and ``learning_curve.png`` (tau against response tokens, log x) to
    ``out_dir``; returns the JSON object."""
    kinds = {p.kind for p in points}
    if len(kinds) > 1:
        raise ValueError(f"the points mix {sorted(kinds)} figures (generation tau and teacher-forced "
                         "acceptance measure different things): give one kind per curve")
    a, b = fit_log_line([p.response_tokens for p in points], [p.tau for p in points])
    needed = math.exp((goal - a) / b) if b > 0 else math.inf
    report = {
        "title": title,
        "points": [vars(p) for p in points],
        "fit": {"form": "tau = a + b * ln(response_tokens)", "a": a, "b": b,
                "tau_gain_per_doubling": b * math.log(2)},
        "goal": {"tau": goal, "response_tokens_on_the_line": needed,
                 "times_the_largest_point": needed / max(p.response_tokens for p in points)},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_curve.json").write_text(json.dumps(report, indent=1) + "\n")
    xs = [p.response_tokens for p in points]

    def draw(ax) -> None:
        from matplotlib.ticker import NullFormatter

        for kind, color in (("benchmark", "C0"), ("teacher-forced", "C2")):
            sel = [p for p in points if p.kind == kind]
            if sel:
                ax.errorbar([p.response_tokens for p in sel], [p.tau for p in sel],
                            yerr=[p.tau_se or 0.0 for p in sel], fmt="o", color=color, capsize=3, zorder=3,
                            label=f"trained drafters ({kind}), +-1 SE")
        for p in points:
            ax.annotate(p.name, (p.response_tokens, p.tau), textcoords="offset points", xytext=(4, -10), fontsize=7)
        hi = max(xs) * 4
        grid = [min(xs) * (hi / min(xs)) ** (i / 50) for i in range(51)]
        ax.plot(grid, [a + b * math.log(x) for x in grid], color="C1", ls="--",
                label=f"fit: +{b * math.log(2):.3f} tau per doubling")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels overlap

    save_tau_figure(out / "learning_curve.png", draw, xlabel="response tokens trained on",
                    title=title or "drafter learning curve")
    return report
