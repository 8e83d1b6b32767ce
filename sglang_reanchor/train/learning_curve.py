"""The data learning curve: drafter acceptance length against training data.

Each point is one trained drafter: the response tokens it was trained on, the labelled
draft slots it saw, and a benchmark run of it (``python -m sglang_reanchor.bench ...
--methods dflash``, its ``results.json``). The tau of a point is read from that stored
run (``summary["all"]["dflash"]["tau"]``, the per-dataset mean the benchmark reports),
never typed in.

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

__all__ = ["CurvePoint", "fit_log_line", "learning_curve", "read_point"]


@dataclass(frozen=True)
class CurvePoint:
    name: str
    response_tokens: int  # distinct target-response tokens in its training data
    labels_seen: int | None  # labelled draft slots trained on (summed over chained runs); None: not recorded
    tau: float  # DFlash acceptance length on the run's prompts
    source: str  # the results.json it was read from


def read_point(name: str, response_tokens: int, labels_seen: int | None, results_json: str | Path,
               method: str = "dflash") -> CurvePoint:
    """A point whose tau is the ``"all"`` mean of ``method`` in a stored benchmark run."""
    summary = json.loads(Path(results_json).read_text())["summary"]
    try:
        tau = float(summary["all"][method]["tau"])
    except KeyError as e:
        raise ValueError(f"{results_json}: no summary['all'][{method!r}]['tau'] (run the benchmark with "
                         f"--methods {method})") from e
    return CurvePoint(name, int(response_tokens), None if labels_seen is None else int(labels_seen), tau,
                      str(results_json))


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

        ax.scatter(xs, [p.tau for p in points], color="C0", zorder=3, label="trained drafters")
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
