"""What the cost budget expected of each round beside what the round delivered, from a served trace.

A REANCHOR server started with ``$SGLANG_REANCHOR_TRACE=FILE`` (and a cost profile,
``$SGLANG_REANCHOR_COST_PROFILE``) writes one JSON line per request per round: the budget the
round was given, its tokens, its wall time and the tokens/s `BatchBudget` expected of every budget
when it chose. This script groups the rounds by batch size and budget and prints, for each, the
rounds run, the mean accepted length per request, the mean round time, the tokens/s delivered
(tokens over round time) and expected (the budget's own figure, averaged over those rounds), and
the time the scheduler spent between rounds (outside ``forward_batch_generation``; it weighs the
same on every budget). A budget whose delivered rate is far below what it was expected to deliver,
while the budget chose it, is where the estimate misleads the choice::

    build/sglang-venv/bin/python scripts/budget_trace.py TRACE.jsonl [--json OUT.json]

The trace's ``round_s`` is host wall time: on a CPU the round's whole cost, on a GPU the time up
to the trace's own device reads (which synchronise).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """The trace's rounds in time order: the lines of one round (one per request) share its
    ``round_start``; each round gets its ``batch``, ``budget``, ``tokens`` (every request's
    accepted length summed), ``round_s``, ``round_start`` and ``expected`` (or None)."""
    by_start: dict[float, dict[str, Any]] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "round_s" not in row:
            raise ValueError(f"{path}:{number}: a trace line without 'round_s' (written before the trace timed "
                             "its rounds); rerun the server with this version")
        rnd = by_start.setdefault(row["round_start"], {
            "batch": row["batch"], "budget": row["budget"], "tokens": 0, "round_s": row["round_s"],
            "round_start": row["round_start"], "expected": row.get("expected")})
        rnd["tokens"] += row["tau"]
    return sorted(by_start.values(), key=lambda r: r["round_start"])


def summarise(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (batch size, budget): rounds, chosen share, tau per request, seconds, tokens/s
    delivered and expected, and the mean gap to the next round (scheduler time between rounds)."""
    gaps: dict[int, float] = {}
    for i, (a, b) in enumerate(zip(rounds, rounds[1:])):
        gap = b["round_start"] - (a["round_start"] + a["round_s"])
        if gap < 1.0:  # longer: the server was idle (no request), not scheduling
            gaps[i] = gap
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, rnd in enumerate(rounds):
        groups[(rnd["batch"], rnd["budget"])].append(i)
    per_batch = defaultdict(int)
    for (bs, _), idx in groups.items():
        per_batch[bs] += len(idx)
    table = []
    for (bs, budget), idx in sorted(groups.items()):
        rs = [rounds[i] for i in idx]
        tokens = sum(r["tokens"] for r in rs)
        seconds = sum(r["round_s"] for r in rs)
        expected = [r["expected"][str(budget)] for r in rs if r["expected"] and str(budget) in r["expected"]]
        gap = [gaps[i] for i in idx if i in gaps]
        table.append({
            "batch": bs, "budget": budget, "rounds": len(rs), "share": len(rs) / per_batch[bs],
            "tau": tokens / (len(rs) * bs), "round_s": seconds / len(rs),
            "delivered_tok_s": tokens / seconds,
            "expected_tok_s": statistics.fmean(expected) if expected else None,
            "gap_s": statistics.fmean(gap) if gap else None,
            "delivered_with_gap_tok_s": tokens / (seconds + sum(gap)) if gap else None,
        })
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    lines = ["| batch | budget | rounds (share) | tau / request | round ms | gap ms | tok/s delivered "
             "| tok/s with gap | tok/s expected |", "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        gap_ms = None if r["gap_s"] is None else 1000 * r["gap_s"]
        lines.append(
            f"| {r['batch']} | {r['budget']} | {r['rounds']} ({r['share']:.0%}) | {r['tau']:.2f} "
            f"| {1000 * r['round_s']:.1f} | {num(gap_ms, '.1f')} | {r['delivered_tok_s']:.1f} "
            f"| {num(r['delivered_with_gap_tok_s'], '.1f')} | {num(r['expected_tok_s'], '.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a $SGLANG_REANCHOR_TRACE file (or it gzipped, .gz)")
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        ap.error(f"trace: {args.trace} is not a file")
    rounds = read_rounds(args.trace)
    if not rounds:
        ap.error(f"trace: {args.trace} holds no rounds")
    table = summarise(rounds)
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
