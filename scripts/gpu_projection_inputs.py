"""Tau-against-node-budget curves from saved CPU benchmark runs, for the GPU projection.

    python scripts/gpu_projection_inputs.py --out scripts/data/gpu_projection_inputs.json \
        --run v3=results/archive/v3/bench_t0/results.json \
        --run cost=results/archive/cost/sweep/results.json

(the command behind the committed ``scripts/data/gpu_projection_inputs.json``). Reads the
traced benchmark runs named by ``--run NAME=PATH`` (``results.json`` of
``python -m sglang_reanchor.bench`` or of ``bench cost``'s sweep; nothing is run: a second or
two of JSON reading) and writes, per (run, method), the round-weighted acceptance length
``tau(b)`` and tree nodes per round ``nodes(b)`` at every node budget ``b`` the run can answer,
plus drafter blocks per round. ``scripts/gpu_check.py --inputs`` reads that file and combines it
with costs measured on a GPU. A curve's ``source`` is its run's NAME; ``sources`` maps each NAME
to its path, command and date.

Why a budget curve can come from one run: tree nodes are numbered parents first and a
budget keeps the lowest ids, so a round verified with budget ``B`` shows what every
``b <= B`` would have accepted (``Record.stats["budget_tau"]``, see
``sglang_reanchor.bench.analysis.budget_taus``). Budgets above the run's own budget are
dropped: the run never verified those nodes.

The committed file's runs (SmolLM2-135M-Instruct + the v2 drafter, T = 0; see
``results/archive/README.md``):

- ``v3``: ``results/archive/v3/bench_t0/results.json``, evaluation prompts (GSM8K, HumanEval,
  MT-Bench, AIME25; 10 each); ReAnchor at budget 48 and fixed-offset D={1} at budget 20;
- ``cost``: ``results/archive/cost/sweep/results.json``, the cost sweep on development prompts
  (GSM8K, HumanEval; 2 each, ``--skip 50``); ReAnchor with D = {1}, {1,2}, {1,2,3} traced at
  budget 128, so the whole curve up to 128 nodes.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from sglang_reanchor.bench.cost import mean_rows  # noqa: E402
from sglang_reanchor.bench.methods import MethodSpec  # noqa: E402
from sglang_reanchor.bench.metrics import Record  # noqa: E402
from sglang_reanchor.config import ReAnchorConfig  # noqa: E402

def _stored_config(text: str) -> ReAnchorConfig | None:
    """The `ReAnchorConfig` a run's meta recorded as its repr (fields added since keep their
    defaults); None if it does not parse."""
    try:
        call = ast.parse(text, mode="eval").body
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "ReAnchorConfig"):
            return None
        return ReAnchorConfig(**{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})
    except (SyntaxError, ValueError, TypeError):
        return None


def prompts_of(command: str) -> str:
    """The prompts a benchmark command ran on, from its ``--datasets``, ``--skip`` and ``--limit``.

    >>> prompts_of("python -m sglang_reanchor.bench cost --datasets gsm8k humaneval --skip 50 --limit 2 --threads 1")
    'gsm8k humaneval: samples 50.. (2 each)'
    """
    words = command.split()

    def values(flag: str) -> list[str]:
        if flag not in words:
            return []
        rest = words[words.index(flag) + 1:]
        return rest[:next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]

    skip, limit = values("--skip"), values("--limit")
    return (" ".join(values("--datasets")) or "default datasets") + ": samples " + (skip[0] if skip else "0") + ".." + (
        f" ({limit[0]} each)" if limit else "")


def parse_run(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` of ``--run`` (NAME: letters, digits, ``_`` and ``-``)."""
    name, sep, path = text.partition("=")
    if not sep or not path or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise argparse.ArgumentTypeError(f"--run takes NAME=PATH (e.g. v3=results/archive/v3/bench_t0/results.json), "
                                         f"got {text!r}")
    return name, Path(path)


def _resolve(path: Path) -> Path:
    return path if path.is_absolute() else ROOT / path


def curves_from_run(name: str, path: Path) -> list[dict]:
    """One curve per traced speculative method of the run at ``path`` (relative paths: to the repo)."""
    run = json.loads(_resolve(path).read_text())
    label = prompts_of(run["meta"].get("command", ""))
    base = ReAnchorConfig()
    if _stored_config(run["meta"].get("config", "")) != base:
        raise ValueError(f"{path}: base config {run['meta'].get('config')!r} is not the library default; "
                         "the run budgets below would be wrong")
    by_method: dict[str, list[Record]] = {}
    for raw in run["records"]:
        rec = Record(**raw)
        if rec.method != "diagnostic" and rec.rounds and rec.stats.get("budget_tau"):
            by_method.setdefault(rec.method, []).append(rec)
    curves = []
    for method, recs in by_method.items():
        spec = MethodSpec.parse(method)
        if spec.method == "target" or spec.auto_budget:
            continue
        rounds = sum(r.rounds for r in recs)
        if spec.method == "dflash":
            tau = sum(sum(r.taus) for r in recs) / rounds
            nodes = sum(sum(r.tree_sizes) for r in recs) / rounds
            points = [{"budget": round(nodes), "tau": tau, "nodes": nodes}]
            offsets, policy, run_budget = [], "chain", round(nodes)
        else:
            config = spec.config(base)
            offsets, policy, run_budget = list(config.offsets), config.policy, config.node_budget
            budgets = sorted({int(b) for r in recs for b in r.stats["budget_tau"] if int(b) <= run_budget})
            points = [{"budget": b,
                       "tau": sum(r.stats["budget_tau"][str(b)] for r in recs) / rounds,
                       "nodes": sum(r.stats["budget_nodes"][str(b)] for r in recs) / rounds} for b in budgets]
            # the run's own tau must be the curve's value at its own budget (a consistency check)
            own = sum(sum(r.taus) for r in recs) / rounds
            if points and points[-1]["budget"] == run_budget and abs(points[-1]["tau"] - own) > 1e-9:
                raise ValueError(f"{path} {method}: budget_tau at {run_budget} ({points[-1]['tau']}) "
                                 f"!= the run's tau ({own})")
        curves.append({
            "source": name, "prompts": label, "method": spec.method, "label": method,
            "offsets": offsets, "policy": policy, "run_budget": run_budget,
            "responses": len(recs), "rounds": rounds, "blocks_per_round": mean_rows(recs), "points": points,
        })
    return curves


def build_inputs(runs: list[tuple[str, Path]]) -> dict:
    """The whole projection-inputs document for the runs ``(NAME, PATH)`` (see the module docstring)."""
    if not runs:
        raise ValueError("need at least one run (--run NAME=PATH)")
    names = [name for name, _ in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must differ, got {names}")
    curves = [c for name, path in runs for c in curves_from_run(name, path)]
    meta = {name: json.loads(_resolve(path).read_text())["meta"] for name, path in runs}
    first = meta[names[0]]
    return {
        "what": "tau (accepted drafts + 1, per verify round, round-weighted) and tree nodes per round "
                "against node budget, traced on CPU runs of SmolLM2-135M-Instruct + the shipped DFlash "
                "drafter at T = 0; budgets above a run's own budget are not included",
        "made_by": "python scripts/gpu_projection_inputs.py " + " ".join(f"--run {n}={p}" for n, p in runs),
        "pair": first.get("drafter", "") + "; target " + first.get("target", ""),
        "sources": {name: {"path": str(path), "command": meta[name].get("command", ""),
                           "date_utc": meta[name].get("date_utc", "")} for name, path in runs},
        "curves": curves,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=parse_run, action="append", required=True, metavar="NAME=PATH",
                        help="a traced benchmark run's results.json, named (repeat for several runs)")
    parser.add_argument("--out", type=Path, required=True, help="output JSON")
    args = parser.parse_args(argv)
    try:
        doc = build_inputs(args.run)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(str(exc))
    out = _resolve(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for c in doc["curves"]:
        pts = ", ".join(f"{p['budget']}: {p['tau']:.3f}" for p in c["points"])
        print(f"{c['source']} {c['label']}: {c['rounds']} rounds, {c['blocks_per_round']:.2f} blocks/round; "
              f"tau by budget {pts}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
