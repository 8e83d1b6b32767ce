"""The data learning curve: points read from real benchmark runs, the log-linear fit."""

from __future__ import annotations

import json
import math

import pytest
from factories import tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor import ReAnchorConfig
from sglang_reanchor.bench.datasets import Sample
from sglang_reanchor.bench.methods import parse_methods
from sglang_reanchor.bench.report import write_report
from sglang_reanchor.bench.runner import BenchSettings, Runner
from sglang_reanchor.train.__main__ import main as train_main
from sglang_reanchor.train.learning_curve import fit_log_line, learning_curve, read_point


def _codec(messages):
    return [1] + [3 + (len(m["content"]) + i) % 3 for i, m in enumerate(messages)]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """`results.json` of a real (tiny) DFlash benchmark run for each of two drafters."""
    target = tiny_target("llama", vocab_size=8, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=3)
    root = tmp_path_factory.mktemp("runs")
    paths, taus = [], []
    for seed in (1, 2):
        runner = Runner(target, tiny_drafter(target, block_size=4, seed=seed), parse_methods(["dflash"]),
                        ReAnchorConfig(offsets=(1,)), _codec, lambda ids: "x" * len(ids),
                        BenchSettings(max_new_tokens=12))
        records = runner.run([Sample("one", "a", ("hi",)), Sample("two", "b", ("hello",))])
        out = write_report(root / f"d{seed}", records, {"command": "pytest"})["json"]
        paths.append(out)
        taus.append(json.loads(out.read_text())["summary"]["all"]["dflash"]["tau"])
    return paths, taus


def test_points_carry_the_stored_tau(two_runs) -> None:
    paths, taus = two_runs
    p = read_point("a", 1000, None, paths[0])
    assert p.tau == taus[0] and p.labels_seen is None and p.source == str(paths[0])
    with pytest.raises(ValueError, match="--methods target"):
        read_point("a", 1000, 5, paths[0], method="target")


@settings(max_examples=50, deadline=None)
@given(a=st.floats(-3, 3), b=st.floats(-1, 1), n=st.integers(2, 8))
def test_fit_recovers_an_exact_log_line(a: float, b: float, n: int) -> None:
    tokens = [1000 * 3 ** i for i in range(n)]
    fa, fb = fit_log_line(tokens, [a + b * math.log(t) for t in tokens])
    assert fa == pytest.approx(a, abs=1e-7) and fb == pytest.approx(b, abs=1e-9)


def test_fit_needs_two_distinct_token_counts() -> None:
    with pytest.raises(ValueError, match="two points"):
        fit_log_line([5, 5], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 token counts but 1"):
        fit_log_line([5, 6], [1.0])


def test_curve_projects_the_goal_on_the_fitted_line(two_runs, tmp_path) -> None:
    paths, taus = two_runs
    lo, hi = sorted(range(2), key=lambda i: taus[i])
    points = [read_point("small", 1_000, 10, paths[lo]), read_point("big", 4_000, 40, paths[hi])]
    report = learning_curve(points, tmp_path, goal=max(taus) + 0.5)
    b = report["fit"]["b"]
    if b > 0:  # two points: the line goes through both, so the goal lies beyond the larger
        a = report["fit"]["a"]
        assert a + b * math.log(report["goal"]["response_tokens_on_the_line"]) == pytest.approx(max(taus) + 0.5)
        assert report["goal"]["times_the_largest_point"] > 1
    else:
        assert report["goal"]["response_tokens_on_the_line"] == math.inf
    assert json.loads((tmp_path / "learning_curve.json").read_text())["points"][1]["tau"] == taus[hi]
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_cli_names_the_bad_point(two_runs, tmp_path, capsys) -> None:
    paths, _ = two_runs
    with pytest.raises(SystemExit, match="NAME:RESPONSE_TOKENS:LABELS_SEEN:RESULTS_JSON"):
        train_main(["learning-curve", "--out", str(tmp_path), "--point", f"a:many:-:{paths[0]}",
                    "--point", f"b:20:-:{paths[1]}"])
    with pytest.raises(SystemExit, match="at least two points"):
        train_main(["learning-curve", "--out", str(tmp_path), "--point", f"a:10:-:{paths[0]}"])
    with pytest.raises(SystemExit, match="No such file"):
        train_main(["learning-curve", "--out", str(tmp_path), "--point", f"a:10:-:{tmp_path}/none.json",
                    "--point", f"b:20:3:{paths[1]}"])
    train_main(["learning-curve", "--out", str(tmp_path), "--point", f"a:10:-:{paths[0]}",
                "--point", f"b:20:3:{paths[1]}"])
    assert "2 points" in capsys.readouterr().out
    assert (tmp_path / "learning_curve.json").exists()
