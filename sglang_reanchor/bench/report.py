"""Benchmark output: markdown tables in the paper's layout, a JSON of every number, PNGs.

`write_report(out_dir, records, meta)` writes ``results.md``, ``results.json``
(meta, summary, analysis counts and every response record) and
``acceptance_histogram.png`` (Figure 2) into ``out_dir``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from ..config import ReAnchorConfig
from . import analysis
from .methods import ABLATIONS, MAIN_METHODS
from .metrics import Record, baseline_method, identity_report, merge_counts, summarize

__all__ = ["analysis_tables", "markdown_report", "write_report", "plot_histogram"]


def _fmt(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _datasets(summary: dict) -> list[str]:
    names = [d for d in summary if d != "all"]
    return names + (["all"] if "all" in summary else [])


def _methods(records: list[Record]) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r.method not in seen and r.method != "diagnostic":
            seen.append(r.method)
    return seen


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def headline_table(summary: dict, methods: list[str]) -> str:
    """Table 2 layout: ``tau / speedup`` per dataset (columns) and method (rows)."""
    ds = _datasets(summary)
    rows = []
    for m in methods:
        cells = [f"{_fmt(summary[d][m]['tau'])} / {_fmt(summary[d][m]['speedup'])}×" if m in summary[d] else "–"
                 for d in ds]
        rows.append([m, *cells])
    return _table(["method", *ds], rows)


def speed_table(summary: dict, methods: list[str]) -> str:
    """tokens/s and mean verified nodes per round."""
    ds = _datasets(summary)
    rows = []
    for m in methods:
        cells = [f"{_fmt(summary[d][m]['tokens_per_s'], 1)} ({_fmt(summary[d][m]['mean_tree_size'], 0)})"
                 if m in summary[d] else "–" for d in ds]
        rows.append([m, *cells])
    return _table(["method: tok/s (nodes/round)", *ds], rows)


def ablation_table(summary: dict, methods: list[str]) -> str:
    """Every ReAnchor variant: tau per dataset and Δtau / speedup averaged over datasets."""
    ds = [d for d in _datasets(summary) if d != "all"]
    variants = [m for m in methods if m == "dflash" or m.startswith("reanchor")]
    rows = []
    for m in variants:
        taus = [summary[d][m]["tau"] if m in summary[d] else float("nan") for d in ds]
        base = [summary[d]["dflash"]["tau"] if "dflash" in summary[d] else float("nan") for d in ds]
        dtau = sum(t - b for t, b in zip(taus, base)) / len(ds) if ds else float("nan")
        speed = [summary[d][m]["speedup"] for d in ds if m in summary[d]]
        rows.append([m, *[_fmt(t) for t in taus], _fmt(dtau, 2) if m != "dflash" else "–",
                     _fmt(sum(speed) / len(speed)) + "×" if speed else "–"])
    return _table(["variant", *ds, "Δtau vs dflash (mean)", "speedup (mean)"], rows)


def analysis_tables(records: list[Record]) -> dict[str, dict[str, dict[str, float]]]:
    """Per dataset (and ``"all"``): Table 1, Table 5 and Table 8 numbers, in percent, with counts."""
    by: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by[r.dataset].append(r)
    by["all"] = list(records)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for ds, recs in by.items():
        dflash = [r for r in recs if r.method == "dflash"]
        reanchor = [r for r in recs if r.method == "reanchor"]
        agr = merge_counts(dflash, "agreement")
        ali = merge_counts(reanchor, "alignment")
        win = merge_counts([r for r in recs if r.method == "diagnostic"], "earliest_win")
        out[ds] = {
            "table1_agreement": {"percent": analysis.ratio(agr.get("agree", 0), agr.get("tokens", 0)), **agr},
            "table5_alignment": {
                "shifted_only_percent": analysis.ratio(ali.get("shifted_only", 0), ali.get("rows", 0)),
                "multiple_percent": analysis.ratio(ali.get("multiple", 0), ali.get("rows", 0)),
                "any_match_percent": analysis.ratio(ali.get("any_match", 0), ali.get("rows", 0)),
                "at_offset_percent": analysis.ratio(ali.get("at_offset", 0), ali.get("rows", 0)),
                **ali,
            },
            "table8_earliest_win": {"win_rate_percent": analysis.ratio(win.get("wins", 0), win.get("tested", 0)), **win},
        }
    return out


def _analysis_markdown(tables: dict) -> str:
    ds = [d for d in tables if d != "all"] + ["all"]
    t1 = _table(["", *ds], [["post-rejection agreement (%)", *[_fmt(tables[d]["table1_agreement"]["percent"], 1) for d in ds]],
                            ["post-rejection tokens", *[str(tables[d]["table1_agreement"].get("tokens", 0)) for d in ds]]])
    t5 = _table(["", *ds], [
        ["shifted only (%)", *[_fmt(tables[d]["table5_alignment"]["shifted_only_percent"], 1) for d in ds]],
        ["multiple (%)", *[_fmt(tables[d]["table5_alignment"]["multiple_percent"], 1) for d in ds]],
        ["any match (%)", *[_fmt(tables[d]["table5_alignment"]["any_match_percent"], 1) for d in ds]],
        ["match at own offset (%)", *[_fmt(tables[d]["table5_alignment"]["at_offset_percent"], 1) for d in ds]],
        ["shifted rows", *[str(tables[d]["table5_alignment"].get("rows", 0)) for d in ds]]])
    t8 = _table(["", *ds], [
        ["tested draft groups", *[str(tables[d]["table8_earliest_win"].get("tested", 0)) for d in ds]],
        ["earliest wins", *[str(tables[d]["table8_earliest_win"].get("wins", 0)) for d in ds]],
        ["win rate (%)", *[_fmt(tables[d]["table8_earliest_win"]["win_rate_percent"], 1) for d in ds]],
        ["groups (round x offset with a match)", *[str(tables[d]["table8_earliest_win"].get("groups", 0)) for d in ds]],
        [f"groups with > {analysis.MAX_SITES} sites (capped)",
         *[str(tables[d]["table8_earliest_win"].get("capped", 0)) for d in ds]]])
    return (f"### Table 1: post-rejection agreement (DFlash rounds)\n\n{t1}\n\n"
            f"### Table 5: start-token alignment (ReAnchor shifted rows)\n\n{t5}\n\n"
            f"### Table 8: earliest-attachment win rate (diagnostic pass)\n\n{t8}\n")


def identity_markdown(records: list[Record]) -> str:
    """`identity_report` as a table: per precision, responses where every method emitted
    the same ids; across precisions, agreement with the baseline's precision."""
    rep = identity_report(records)
    rows = []
    for dtype, r in rep.items():
        agree = next(((k, v) for k, v in r.items() if k.endswith("_responses") and k.startswith("agree")), None)
        share = next((v for k, v in r.items() if k.endswith("_token_share")), None)
        cross = (f"{agree[1]} / {r['compared_responses']} responses, {_fmt(100 * share, 1)} % of tokens"
                 if agree and share is not None else "–")
        rows.append([dtype or "?", f"{r['identical']} / {r['responses']}", cross])
    table = _table(["precision", "responses with identical tokens across its methods",
                    "first turns equal to the baseline precision's"], rows)
    per = [[dtype, m, r["reference"], f"{r['identical']} / {r['responses']}", _fmt(100 * r["token_share"], 1),
            "–" if r.get("largest_gap_float32") is None else f"{r['largest_gap_float32']:.3g}"]
           for dtype, rep_d in rep.items() for m, r in rep_d["methods"].items()]
    return table + "\n\nPer method, against plain decoding in the same precision (token share: positions " \
        "before the first difference, over all positions; gap: the largest float32 logit gap between the two " \
        "tokens where they part, i.e. how near a tie it was):\n\n" + _table(
            ["precision", "method", "against", "identical responses", "token share (%)", "largest gap (fp32)"], per)


def budget_table(records: list[Record]) -> str:
    """tau against node budget, from traced runs: each method's rounds cut to the first ``b``
    nodes (parents first) at the method's own depth cap (`analysis.capped_taus`), so one run at
    budget ``B`` answers every ``b <= B``; "–" past the first column that covers the run's budget. Empty when no
    run was traced or none has a depth cap the trace covers."""
    from .methods import MethodSpec
    from .runner import CAPPED_BUDGETS, DEPTHS

    rows = []
    for m in _methods(records):
        spec = MethodSpec.parse(m)
        recs = [r for r in records if r.method == m and r.stats.get("capped_tau")]
        depth = spec.config(ReAnchorConfig()).max_depth
        if spec.method == "target" or not recs or depth not in DEPTHS:
            continue
        run_budget = depth + 1 if spec.method == "dflash" else spec.config(ReAnchorConfig()).node_budget
        n = sum(r.rounds for r in recs)
        last = min((b for b in CAPPED_BUDGETS if b >= run_budget), default=CAPPED_BUDGETS[-1])
        cells = [_fmt(sum(r.stats["capped_tau"][f"{b}@{depth}"] for r in recs) / n) if b <= last else "–"
                 for b in CAPPED_BUDGETS]
        rows.append([m, *cells])
    return _table(["method (tau at budget b)", *map(str, CAPPED_BUDGETS)], rows) if rows else ""


def markdown_report(records: list[Record], meta: dict) -> str:
    summary = summarize(records)
    methods = _methods(records)
    main = [m for m in MAIN_METHODS if m in methods] + [m for m in methods if m not in MAIN_METHODS]
    base = baseline_method(records)
    parts = [f"# ReAnchor benchmark\n\n{meta.get('description', '')}\n",
             f"## Acceptance length tau / speedup over `{base}` (Table 2 layout)\n",
             f"Speedups are over `{base}`, the fastest plain decoding of this run "
             f"(threads: {meta.get('torch_threads', '?')}, one process).\n",
             headline_table(summary, main), "",
             "## Tokens/s (mean verified nodes per round)\n", speed_table(summary, main), "",
             "## Identical tokens (from the stored hashes)\n", identity_markdown(records), ""]
    if any(m.startswith("reanchor:") for m in methods):
        names = {s for group in ABLATIONS.values() for s in group}
        parts += ["## Ablations (Tables 4, 6, 7)\n",
                  "Table 4: `region=in_block` / `region=beyond`; Table 6: `policy=offset|random|earliest "
                  "(reanchor)|longest_prefix`; Table 7: `policy=offset` (fixed offset) vs `reanchor` (earliest)."
                  + ("" if names <= set(methods) else " (Only the variants run are listed.)") + "\n",
                  ablation_table(summary, main), ""]
    budgets = budget_table(records)
    if budgets:
        parts += ["## tau against node budget (traced runs)\n",
                  "Each round cut to its first b nodes (parents first) at the method's depth cap: what a "
                  "smaller budget would have accepted with the same drafts. tau here is per round over all "
                  "rounds (the headline table averages per response first).\n", budgets, ""]
    parts += ["## Analysis\n", _analysis_markdown(analysis_tables(records))]
    if meta.get("command"):
        parts += ["## Command\n", f"```\n{meta['command']}\n```\n"]
    return "\n".join(parts)


def plot_histogram(records: list[Record], path: Path, methods: tuple[str, ...] = ("dflash", "reanchor")) -> bool:
    """Figure 2: per-round tau distribution per dataset; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    datasets = sorted({r.dataset for r in records})
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(4.2 * max(len(datasets), 1), 3.2), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        top = 1
        for k, m in enumerate(methods):
            taus = [t for r in records if r.dataset == ds and r.method == m for t in r.taus]
            if not taus:
                continue
            hist = analysis.histogram(taus)
            top = max(top, max(hist))
            xs = [x + (k - 0.5) * 0.4 for x in hist]
            ax.bar(xs, [100 * v / len(taus) for v in hist.values()], width=0.4, label=m)
        ax.set_title(ds)
        ax.set_xlabel("acceptance length per round")
        ax.set_xticks(range(1, top + 1, max(1, top // 8)))
    axes[0][0].set_ylabel("% of rounds")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(out_dir: str | Path, records: list[Record], meta: dict) -> dict[str, Path]:
    """Write ``results.md``, ``results.json`` and the histogram PNG; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md", "json": out / "results.json"}
    paths["markdown"].write_text(markdown_report(records, meta))
    hist = {ds: {m: analysis.histogram([t for r in records if r.dataset == ds and r.method == m for t in r.taus])
                 for m in _methods(records)} for ds in sorted({r.dataset for r in records})}
    payload = {"meta": meta, "summary": summarize(records), "baseline": baseline_method(records),
               "identity": identity_report(records), "analysis": analysis_tables(records),
               "histograms": hist, "records": [r.to_json() for r in records]}
    paths["json"].write_text(json.dumps(payload, indent=1, default=str))
    png = out / "acceptance_histogram.png"
    if plot_histogram(records, png):
        paths["png"] = png
    return paths
