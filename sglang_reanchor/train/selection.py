"""Which prompts go into which data folder, and which group each sequence trains for.

The v7 recipe (issue 25) trains on a mix weighted toward the benchmark's work: math
word problems (GSM8K / AIME-like) and function stubs (HumanEval-like) make at least two
thirds of the sequences drawn, the rest (chat, other code) one third. Each prompt has a
*group* read from its ``source`` (`prompt_group`); the trainer draws sequences with
per-group weights (`sequence_weights`), and the teacher-forced validation reports each
group beside the mean.

A held-out set is a list of `prompt_key`\\ s (`read_keys`): ``data --keys FILE`` builds a
folder of those prompts only (the validation folder), ``data --exclude-keys FILE`` one
without them (the training folders). `pack_difference` lists the keys of a pack that an
older pack does not hold: responses no earlier drafter was trained on, so a held-out set
drawn from them is fair to the baseline drafters too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from safetensors import safe_open

from .data import prompt_key
from .prompts import Prompt

__all__ = ["GROUPS", "group_folders", "pack_difference", "prompt_group", "read_keys", "select_prompts", "sequence_prompts",
           "sequence_weights", "truncate_responses", "write_keys"]

# group -> source prefixes (a prompt's source starts with one of them); "other" is the rest
GROUPS: dict[str, tuple[str, ...]] = {
    "math": ("template:math", "champ-dataset"),
    "stub": ("python-3.11-stdlib-stub",),
}


def prompt_group(source: str) -> str:
    """``"math"``, ``"stub"`` or ``"other"`` for a prompt's ``source`` string."""
    for name, prefixes in GROUPS.items():
        if source.startswith(prefixes):
            return name
    return "other"


def read_keys(path: str | Path) -> set[str]:
    """The `prompt_key`\\ s of a key file: one per line, ``#`` comments and blank lines skipped."""
    keys = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            keys.add(line)
    if not keys:
        raise ValueError(f"{path}: no prompt keys (one 16-hex-digit key per line)")
    return keys


def write_keys(keys: Iterable[str], path: str | Path, header: str = "") -> None:
    lines = [f"# {h}" for h in header.splitlines()] + sorted(keys)
    Path(path).write_text("\n".join(lines) + "\n")


def pack_difference(new_pack: str | Path, old_pack: str | Path) -> list[str]:
    """Keys of ``new_pack`` absent from ``old_pack`` (both `write_pack` files), in pack order."""
    import numpy as np

    old = {str(k) for k in np.load(old_pack)["keys"]}
    return [str(k) for k in np.load(new_pack)["keys"] if str(k) not in old]


def select_prompts(prompts: Sequence[Prompt], *, keys: set[str] | None = None,
                   exclude_keys: set[str] | None = None, groups: Sequence[str] | None = None,
                   known: dict[str, list[int]] | None = None) -> list[Prompt]:
    """The prompts (order kept) whose key is in ``keys`` (when given), not in
    ``exclude_keys``, whose `prompt_group` is one of ``groups`` (when given) and, when
    ``known`` is given, that have a stored response there."""
    allowed = {"math", "stub", "other"}
    if groups is not None and not set(groups) <= allowed:
        raise ValueError(f"groups must be among {sorted(allowed)}, got {sorted(set(groups) - allowed)}")
    out = []
    for p in prompts:
        k = prompt_key(p.text)
        if keys is not None and k not in keys:
            continue
        if exclude_keys is not None and k in exclude_keys:
            continue
        if groups is not None and prompt_group(p.source) not in groups:
            continue
        if known is not None and k not in known:
            continue
        out.append(p)
    return out


def truncate_responses(known: dict[str, list[int]], max_tokens: int) -> dict[str, list[int]]:
    """Stored greedy responses cut to their first ``max_tokens`` tokens: the greedy
    response of a decode capped at ``max_tokens`` new tokens is exactly that prefix."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    return {k: v[:max_tokens] for k, v in known.items()}


def sequence_prompts(data_dir: str | Path) -> list[Prompt]:
    """The prompt of every sequence of a data folder, in `load_sequences` order (shards
    in name order, rows in shard order), from each shard's ``prompt_index`` metadata."""
    rows = [json.loads(line) for line in (Path(data_dir) / "prompts.jsonl").read_text().splitlines()
            if line.strip()]
    prompts = [Prompt(r.get("domain", ""), r.get("source", ""), r["text"]) for r in rows]
    out = []
    for shard in sorted(Path(data_dir).glob("shard_*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            out += [prompts[i] for i in json.loads(f.metadata()["prompt_index"])]
    return out


def sequence_weights(groups: Sequence[str], mix: dict[str, float]) -> list[float]:
    """Per-sequence draw probabilities (summing to 1) so that a draw lands in group ``g``
    with probability ``mix[g] / sum(mix)``, uniform inside a group. A group of ``mix``
    with no sequence gives its share to the others (renormalised); a sequence whose
    group has no weight is never drawn."""
    bad = {g: w for g, w in mix.items() if not w >= 0}
    if bad:
        raise ValueError(f"mix weights must be >= 0, got {bad}")
    counts: dict[str, int] = {}
    for g in groups:
        counts[g] = counts.get(g, 0) + 1
    total = sum(w for g, w in mix.items() if counts.get(g))
    if total <= 0:
        raise ValueError(f"mix {mix} gives no weight to any group present ({sorted(counts)})")
    return [mix.get(g, 0.0) / total / counts[g] for g in groups]


def group_folders(dirs: Sequence[str | Path]) -> list[str]:
    """The prompt group of every sequence of data folders, in `load_sequences` order."""
    return [prompt_group(p.source) for d in dirs for p in sequence_prompts(d)]
