"""scripts/gpu_check.py: its CPU smoke mode writes a real JSON and markdown; its projection inputs match their runs.

The runs behind ``scripts/data/gpu_projection_inputs.json`` are fixtures (``tests/fixtures/projection_runs``,
see ``tests/fixtures/README.md``): no test reads ``results/``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_reanchor.budget import interpolate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
INPUTS = ROOT / "scripts" / "data" / "gpu_projection_inputs.json"
RUNS = ROOT / "tests" / "fixtures" / "projection_runs"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_argument_errors(tmp_path: Path) -> None:
    bad = run_script(str(tmp_path), "--models", "4b,3b")
    assert bad.returncode == 2 and "--models" in bad.stderr
    bad = run_script(str(tmp_path), "--batch-sizes", "4,16")
    assert bad.returncode == 2 and "must include 1" in bad.stderr


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cpu_smoke_run_writes_checked_tables(tmp_path: Path) -> None:
    result = run_script(str(tmp_path), "--device", "cpu", "--smoke")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    md = (tmp_path / "gpu_check.md").read_text()
    assert doc["ok"] and doc["meta"]["smoke"] and doc["skipped"] == []
    assert doc["checks_run"] == 1 + 2 * 2  # attention + (dflash, reanchor) per model

    att = doc["attention"]
    assert len(att["rows"]) == 4 and all(r["ok"] for r in att["rows"])
    assert all(r["triton_ms"] > 0 and r["ref_ms"] > 0 and r["triton_max_abs_err"] < 1e-3 for r in att["rows"])

    assert [m["shape"]["name"] for m in doc["models"]] == ["tiny-4b-like", "tiny-8b-like"]
    for m in doc["models"]:
        assert m["shape"]["drafter_layers"] == 5 and m["shape"]["block_size"] == 16
        assert set(m["verify_ms"]) == {"1", "2"} and set(m["draft_ms"]) == {"1", "2"}
        assert all(v > 0 for bs in m["verify_ms"].values() for v in bs.values())
        assert all(v > 0 for bs in m["draft_ms"].values() for v in bs.values())
        assert all(v > 0 for v in m["decode_ms"].values())
        ll = m["lossless"]
        assert ll["dflash"] is True and ll["reanchor"] is True
        assert all(p["dflash_rounds"] > 0 and p["reanchor_rounds"] > 0 and p["greedy_tokens"] == 12
                   for p in ll["prompts"])
        over = m["overhead"]
        assert over["dflash"]["rounds"] > 0 and over["reanchor"]["ms_per_round"] > 0
        assert over["dflash"]["forwards_ms"] > 0

    proj = doc["projection"]
    assert "PROJECTION, not a measurement" in proj["note"] and "SmolLM2" in proj["note"]
    assert proj["inputs"] == "scripts/data/gpu_projection_inputs.json"
    assert set(proj["sources"]) == {"v3", "cost"}
    models = {m["shape"]["name"]: m for m in doc["models"]}
    for name in models:
        for bs in (1, 2):
            rows = [r for r in proj["rows"] if r["model"] == name and r["batch"] == bs]
            assert {r["method"] for r in rows} == {"target", "dflash", "reanchor"}
            assert all(r["tokens_per_s"] > 0 for r in rows)
            assert next(r for r in rows if r["method"] == "target")["speedup"] == 1.0
    # the projection is computed from the measured costs, not written down
    m = models["tiny-8b-like"]
    row = next(r for r in proj["rows"] if r["model"] == "tiny-8b-like" and r["batch"] == 2 and r["method"] == "dflash")
    verify = {int(k): v for k, v in m["verify_ms"]["2"].items()}
    draft = {int(k): v for k, v in m["draft_ms"]["2"].items()}
    overhead = max(0.0, m["overhead"]["dflash"]["overhead_ms"])
    expect = interpolate(verify, row["nodes"]) + interpolate(draft, 1.0) + overhead
    assert row["round_ms"] == pytest.approx(expect)
    assert row["tokens_per_s"] == pytest.approx(1e3 * 2 * row["tau"] / expect)
    assert {(r["model"], r["method"]) for r in proj["paper_tau_rows"]} == {
        (n, k) for n in models for k in ("dflash", "reanchor")}

    for text in ("## (a) Triton tree attention", "## (b) tiny-4b-like", "## (b) tiny-8b-like",
                 "## (c) Projected tokens/s (a projection, not a measurement)", "## (d) FlashInfer",
                 "dflash == HF greedy: **True**", "reanchor == HF greedy: **True**", "**Result: PASS**"):
        assert text in md, text
    assert md.count("| tiny-8b-like | 2 | v3 |") == 1


def test_time_budget_marks_everything_skipped(tmp_path: Path) -> None:
    result = run_script(str(tmp_path), "--device", "cpu", "--smoke", "--time-budget", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["checks_run"] == 0 and doc["models"] == [] and doc["projection"]["rows"] == []
    assert len(doc["attention"]["skipped"]) == 4
    assert sum("whole section (time budget)" in s for s in doc["skipped"]) == 2
    assert "nothing was checked" in (tmp_path / "gpu_check.md").read_text()


def load_inputs_module():
    path = ROOT / "scripts" / "gpu_projection_inputs.py"
    spec = importlib.util.spec_from_file_location("gpu_projection_inputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without_paths(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "made_by"} | {
        "sources": {name: {k: v for k, v in src.items() if k != "path"} for name, src in doc["sources"].items()}}


def test_saved_projection_inputs_match_their_runs() -> None:
    module = load_inputs_module()
    fresh = module.build_inputs([("v3", RUNS / "v3_bench_t0_traced.json"), ("cost", RUNS / "cost_sweep.json")])
    saved = json.loads(INPUTS.read_text())
    assert without_paths(saved) == without_paths(json.loads(json.dumps(fresh)))
    assert saved["sources"]["v3"]["path"] == "results/archive/v3/bench_t0/results.json"
    assert saved["sources"]["cost"]["path"] == "results/archive/cost/sweep/results.json"
    labels = {(c["source"], c["label"]) for c in saved["curves"]}
    assert ("v3", "reanchor") in labels
    assert ("cost", "reanchor:offsets=1/2/3,node_budget=128") in labels
    for c in saved["curves"]:
        budgets = [p["budget"] for p in c["points"]]
        assert budgets == sorted(budgets) and budgets[-1] <= c["run_budget"]
        taus = [p["tau"] for p in c["points"]]
        assert taus == sorted(taus)  # a larger budget keeps every smaller budget's accepted nodes


def test_projection_inputs_command_line(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "scripts" / "gpu_projection_inputs.py")]
    out = tmp_path / "inputs.json"
    ok = subprocess.run([*script, "--run", f"cost={RUNS / 'cost_sweep.json'}", "--out", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(out.read_text())
    assert {c["source"] for c in doc["curves"]} == {"cost"} and len(doc["curves"]) == 4
    for argv, message in ((["--out", str(out)], "--run"), (["--run", "v3", "--out", str(out)], "NAME=PATH"),
                          (["--run", "a=x.json", "--run", "a=y.json", "--out", str(out)], "must differ")):
        bad = subprocess.run([*script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
