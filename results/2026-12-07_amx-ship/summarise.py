"""The T = 0 run of run_bench.sh summarised per method over all four datasets, with and without GSM8K
samples 6 and 7 (each had one method slowed by other work on the machine: plain bfloat16 in sample 6,
cause not found; DSpark's and Domino's ReAnchor rows in sample 7, a 13-second test run started during the
benchmark). tau is unaffected either way. The benchmark's own averages (tau and speedup: the mean of the
per-dataset figures; tokens/s pooled). Prints a markdown table and writes summary.json beside it.

    python results/2026-12-07_amx-ship/summarise.py results/2026-12-07_amx-ship/bench_t0
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_reanchor.bench.metrics import Record, summarize

EXCLUDED = {("gsm8k", "6"), ("gsm8k", "7")}
BEST_PLAIN = "target:dtype=float32"


def summarise(records: list[dict], exclude: set[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """The benchmark's own "all" row (`bench.metrics.summarize`) over the records not in ``exclude``."""
    kept = [Record(**r) for r in records if (r["dataset"], str(r["sample"])) not in exclude]
    return summarize(kept, BEST_PLAIN)["all"]


def main() -> None:
    folder = Path(sys.argv[1])
    records = json.loads((folder / "results.json").read_text())["records"]
    full, clean = summarise(records, set()), summarise(records, EXCLUDED)
    chain = "dflash:max_depth=6,draft_vocab=8192"
    print("| method | tau | tau / v8 chain | tokens/s | x best plain | without GSM8K 6-7: tokens/s, x best plain |")
    print("|---|---|---|---|---|---|")
    for m in dict.fromkeys(r["method"] for r in records):
        f, c = full[m], clean[m]
        print(f"| `{m}` | {f['tau']:.2f} | {f['tau'] / full[chain]['tau']:.2f} | {f['tokens_per_s']:.1f} | "
              f"{f['speedup']:.2f} | {c['tokens_per_s']:.1f}, {c['speedup']:.2f} |")
    (folder / "summary.json").write_text(json.dumps({"all": full, "without_gsm8k_6_7": clean}, indent=1) + "\n")


if __name__ == "__main__":
    main()
