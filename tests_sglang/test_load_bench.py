"""`scripts/load_bench.py`'s interleaved figures (repeats merged, ratios from neighbouring measurements) and its
code versions (``--tree``: what a server of ``METHOD@LABEL`` imports).

The servers themselves are exercised by the serving tests (`http_server.launch`); a full run is a
benchmark (`results/*/load_*`), not a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import load_bench  # noqa: E402


def _level(tokens_per_s: float, answers: dict[str, list[int]], c: int = 4) -> dict:
    return {"concurrency": c, "requests": 8, "seconds": 256 / tokens_per_s, "requests_per_s": 8 * tokens_per_s / 256,
            "tokens_per_s": tokens_per_s, "mean_latency_s": 1.0, "answers": answers}


def test_repeats_merge_to_medians_and_say_whether_answers_held():
    same = {"0": [1, 2], "1": [3]}
    merged = load_bench.merge_repeats([_level(10.0, same), _level(30.0, same), _level(20.0, same)])
    assert merged["tokens_per_s"] == 20.0 and merged["concurrency"] == 4
    assert [r["tokens_per_s"] for r in merged["repeats"]] == [10.0, 30.0, 20.0]
    assert all("answers" not in r for r in merged["repeats"]) and merged["answers"] == same
    assert merged["answers_stable"]
    assert not load_bench.merge_repeats([_level(10.0, same), _level(10.0, {"0": [1, 2], "1": [4]})])["answers_stable"]


def test_interleaved_ratios_pair_each_repeat_with_plains_neighbour():
    """The machine slows down between repeats: two of three repeats' ratios are 1.10, the medians' 0.82."""
    answers = {"0": [1]}
    plain = load_bench.merge_repeats([_level(t, answers) for t in (100.0, 50.0, 80.0)])
    fast = load_bench.merge_repeats([_level(t * 1.1, answers) for t in (100.0, 50.0, 60.0)])
    ratios = sorted([1.1, 1.1, 66 / 80])
    assert load_bench.ratio_to(fast, plain) == f"{ratios[1]:.2f}x [{ratios[0]:.2f}-{ratios[2]:.2f}]"
    # one server at a time: the plain ratio of the two figures
    assert load_bench.ratio_to(_level(33.0, answers), _level(30.0, answers)) == "1.10x"


@pytest.mark.parametrize("interleave", [0, 3])
def test_the_report_names_how_it_was_measured(interleave):
    answers = {"0": [1, 2]}
    levels = {"plain": [(1, 10.0), (16, 100.0)], "chain-cost": [(1, 12.0), (16, 90.0)]}
    runs: dict[str, list[dict]] = {}
    for method, figures in levels.items():
        runs[method] = [load_bench.merge_repeats([_level(t * k, answers, c) for k in (1.0, 0.9, 1.1)])
                        if interleave else _level(t, answers, c) for c, t in figures]
    meta = {"target": "t", "drafter": "d", "max_new_tokens": 32, "requests": 8, "dtype": "float32",
            "command": "load_bench.py ...", "configs": {"plain": None, "chain-cost": "{}"}, "interleave": interleave}
    text = load_bench.markdown({"meta": meta, "runs": runs})
    assert ("each level measured 3 times" in text) == bool(interleave)
    assert ("one server at a time" in text) == (not interleave)
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert "(1.20x" in row and ("[1.20-1.20]" in row) == bool(interleave)
    assert "| chain-cost | 2 / 2 |" in text  # one answer per level, equal to plain's


def test_a_tree_from_a_git_revision_is_what_its_servers_import(tmp_path):
    """``--tree old=HEAD`` exports HEAD's package; a process with the method's environment imports that copy
    (and its SGLang plugin entry point resolves there), not the installed one."""
    repo = Path(load_bench.HERE).parent
    if subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    trees = load_bench.parse_trees(["old=HEAD", f"here={repo}"], repo, tmp_path)
    assert trees == {"old": tmp_path / "old", "here": repo.resolve()}
    assert (tmp_path / "old" / "sglang_reanchor" / "srt" / "plugin.py").is_file()
    assert not (tmp_path / "old" / "results").exists()
    assert load_bench.split_method("reanchor-cost@old", trees) == ("reanchor-cost", "old")
    assert load_bench.split_method("plain", trees) == ("plain", None) and load_bench.tree_env(None, trees) == {}
    probe = ("import sys, sglang_reanchor, importlib.metadata as md; print(sglang_reanchor.__file__); "
             "[e.load() for e in md.entry_points(group='sglang.srt.plugins') if e.name == 'reanchor']; "
             "print(sys.modules['sglang_reanchor.srt.plugin'].__file__)")
    env = {**os.environ, **load_bench.tree_env("old", trees)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    assert out == [str(tmp_path / "old" / "sglang_reanchor" / "__init__.py"),
                   str(tmp_path / "old" / "sglang_reanchor" / "srt" / "plugin.py")]


@pytest.mark.parametrize("spec, message", [
    ("old", "LABEL=SOURCE"), ("1x=HEAD", "LABEL=SOURCE"), ("old=no-such-revision-xyz", "neither a folder"),
])
def test_a_bad_tree_is_named_in_the_error(tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        load_bench.parse_trees([spec], Path(load_bench.HERE).parent, tmp_path)
    with pytest.raises(ValueError, match="holds no sglang_reanchor"):
        load_bench.parse_trees([f"x={tmp_path}"], Path(load_bench.HERE).parent, tmp_path)
    with pytest.raises(ValueError, match="unknown method 'reanchr'"):
        load_bench.split_method("reanchr@x", {})
    with pytest.raises(ValueError, match="no --tree labelled 'new'"):
        load_bench.split_method("reanchor@new", {"old": tmp_path})


def test_a_code_ab_report_compares_with_its_baseline():
    answers = {"0": [1, 2]}
    runs = {"reanchor-cost@before": [_level(10.0, answers, 1)], "reanchor-cost@after": [_level(11.0, answers, 1)]}
    meta = {"target": "t", "drafter": "d", "max_new_tokens": 32, "requests": 8, "dtype": "float32",
            "command": "load_bench.py ...", "configs": {"plain": None, "reanchor-cost": "{}"}, "interleave": 0,
            "trees": {"before": "HEAD~1", "after": "."}, "baseline": "reanchor-cost@before"}
    text = load_bench.markdown({"meta": meta, "runs": runs})
    assert "## Output tokens/s (x reanchor-cost@before)" in text and "11.0 (1.10x)" in text
    assert "`@before` = `HEAD~1`" in text and "`reanchor-cost` = `{}`" in text and "`plain`" not in text
    assert "| reanchor-cost@after | 1 / 1 |" in text


def test_a_report_without_a_baseline_gives_figures_alone():
    runs = {"chain-cost": [_level(12.0, {"0": [1]}, 1)], "reanchor-cost": [_level(13.0, {"0": [1]}, 1)]}
    meta = {"target": "t", "drafter": "d", "max_new_tokens": 32, "requests": 8, "dtype": "float32",
            "command": "load_bench.py ...", "configs": {"chain-cost": "{}", "reanchor-cost": "{}"}, "interleave": 2,
            "baseline": None}
    text = load_bench.markdown({"meta": meta, "runs": runs})
    assert "## Output tokens/s\n" in text and "| 1 | 12.0 | 13.0 |" in text
    assert " x " not in text and "Answers equal" not in text
