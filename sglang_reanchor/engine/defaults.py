"""Defaults that pay on the machine in use: the paper's configuration on a GPU, a measured one on a CPU.

The paper's configuration (`PAPER_CONFIG` = ``ReAnchorConfig()``: the ``earliest`` rule,
D = {1, 2, 3}, 48 nodes, whole blocks) assumes that verifying 48 nodes costs about one decode
step, as on a GPU. On a CPU every verified node and every drafter block costs: there it runs
the SmolLM2 pair at 0.3-0.7x plain decoding. `device_config` therefore chooses, on a CPU, among
a few small trees (`CPU_CANDIDATES`) the one that is fastest *on this machine*:

1. a choice shipped with the drafter (``device_defaults.json`` in its folder), when one was
   measured on a CPU of the same kind (model name, bfloat16 flags, torch threads, dtype);
2. else one cached by an earlier measurement here (``$SGLANG_REANCHOR_CACHE/device_defaults/``);
3. else it measures: each candidate decodes two short built-in prompts once (under a
   minute for the SmolLM2 pair on a 2-core AVX2 CPU), the fastest is cached under a key of the machine, the pair and
   the dtype, and later calls read it.

A shipped entry may also hold a choice measured at a temperature > 0 (``"sampled"``:
`scripts/ship_device_defaults.py --temperature 1`): fewer drafts are accepted when the target
samples, so the tree that pays differs; `SpeculativeGenerator.generate` runs it for sampled
requests. Every candidate is lossless, so the choice changes speed only, never tokens. Elsewhere (CUDA)
the result is `PAPER_CONFIG`. The choice is the fastest *speculative* setting; it records plain
decoding's speed beside its own, because on some CPUs none beats plain decoding with a given
drafter (the 2-core AVX2 EPYC of 2026-12-03, float32, drafter v6: a round costs 2.3 decode steps
while tau is 1.6-1.9, so the best setting runs at 0.76x; results/2026-12-03_v6-4dd68a761ab8/). Where a
verified node is cheap (a 2-core Xeon with AMX-BF16, bfloat16: ~0.8 ms a node against ~40 ms a token)
the shipped entry, one shifted row plus four branches at 16 nodes, runs at 1.14x the fastest plain
decoding and 1.04x the chain (results/2026-12-05_amx-defaults_v7-3ec5d29a511d/).

>>> PAPER_CONFIG == ReAnchorConfig()
True
>>> all(c.offsets and c.max_depth for c in CPU_CANDIDATES)  # every candidate re-anchors, depth-capped
True
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import ReAnchorConfig
from ..precision import cpu_bf16_flags

__all__ = ["CPU_CANDIDATES", "PAPER_CONFIG", "DeviceChoice", "device_config", "fitting_candidates", "machine_key",
           "measure_candidates", "pair_fingerprint", "shipped_choice"]

PAPER_CONFIG = ReAnchorConfig()
# Small trees for a CPU, from the cost model (`sglang_reanchor.bench.cost`): the fixed-offset rule
# with D = {1, 2, 3} and an 8-node budget, drafts verified to depth 3, without and with branching
# at the first baseline slots; one-row variants whose drafter forward is cheaper.
CPU_CANDIDATES: tuple[ReAnchorConfig, ...] = (
    ReAnchorConfig(policy="offset", offsets=(1, 2, 3), node_budget=8, max_depth=3, draft_vocab=8192),
    ReAnchorConfig(policy="offset", offsets=(1, 2, 3), node_budget=8, max_depth=3, draft_vocab=8192,
                   branch_width=2, branch_rows=4),
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=6, max_depth=3, draft_vocab=8192),
    ReAnchorConfig(policy="offset", offsets=(1, 2, 3), node_budget=12, max_depth=6, draft_vocab=8192),
    # one row, deeper: where a verified node is cheap (AMX bfloat16: 8 nodes cost ~1.1 steps)
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=8, max_depth=6, draft_vocab=8192),
    # one row to depth 6, each row cut where the drafter's confidence runs out: deep only where it is
    # sure (Zen 4 AVX-512 BF16: 3 nodes a round instead of 9, 1.26x plain against 1.19x uncut)
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=9, max_depth=6, draft_vocab=8192,
                   verify_threshold=0.3),
    # one row plus the drafter's 4 likeliest runner-up tokens (3-token branches): where nodes are cheap, the
    # runner-ups add more tau than more shifted rows (AMX bfloat16, 24 nodes: 1.19x the chain's tau)
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=16, max_depth=6, draft_vocab=8192,
                   branch_width=2, branch_rows=4, branch_length=3),
    # the same, rows and branches cut where the drafter's confidence runs out: 6 nodes a round instead of 16
    # (Zen 4 AVX-512 BF16, v8: tau 1.13x the chain's at 1.31x plain, against 1.19x at 16 nodes uncut)
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=16, max_depth=6, draft_vocab=8192,
                   branch_width=2, branch_rows=4, branch_length=3, verify_threshold=0.1),
    # one row and DDTree's best-first tree over each slot's top 5 tokens, cut at 0.05: branches only where the
    # drafter hesitates (Zen 4 AVX-512 BF16, v8, held-out prompts: 9 nodes a round, tau 1.23x the chain's,
    # 28.2 tokens/s against the shipped entry's 27.2 and the chain's 26.1)
    ReAnchorConfig(policy="offset", offsets=(1,), node_budget=24, max_depth=6, draft_vocab=8192,
                   branch_width=4, branch_rows=32, branch_length=6, branch_shape="best_first",
                   verify_threshold=0.05),
)
# Measured on first use where nothing shipped or cached fits: neither is from an evaluation set.
MEASURE_PROMPTS: tuple[str, ...] = (
    "A baker sells 14 loaves in the morning and twice as many in the afternoon. Each loaf costs "
    "3 dollars. How much money does the baker make in total? Explain step by step.",
    "Write a Python function `count_vowels(text)` that returns the number of vowels in a string.",
)
# in a drafter folder: {"entries": [{"key": ..., "config": ..., "served": {"config": {...}, "cost_profile": ...,
# "measured": ...}}]}; "served" (optional) holds what an SGLang server changes on top of "config" (the
# engine's choice, measured one request at a time), measured under load: batch_node_budget and
# disable_by_batch_size (`SERVED_FIELDS`), or a cost
# profile of this machine kind (a file in the folder) for the batch-aware budget (`budget.BatchBudget`),
# and "cost_profile_packed", one measured with packed linears, for servers that pack them
# ($SGLANG_REANCHOR_PACK_LINEARS, `srt.packed_linears`)
SHIPPED_FILE = "device_defaults.json"
SERVED_FIELDS = ("batch_node_budget", "disable_by_batch_size")  # what an entry's served.config may set


@dataclass(frozen=True)
class DeviceChoice:
    """The chosen config, where it came from (``"paper"``, ``"shipped"``, ``"cached"``,
    ``"measured"``) and the tokens/s measured for it and for plain decoding (None if not measured)."""

    config: ReAnchorConfig
    source: str
    tokens_per_s: float | None = None
    plain_tokens_per_s: float | None = None
    served: ReAnchorConfig | None = None  # what an SGLang server serves instead (shipped entries' "served")
    served_measured: str = ""  # where that was measured
    served_cost_profile: Path | None = None  # the cost profile an SGLang server budgets batches with
    served_cost_profile_packed: Path | None = None  # ... one whose linears are packed (`srt.packed_linears`)
    sampled: DeviceChoice | None = None  # the choice measured at a temperature > 0 (shipped entries' "sampled")


def machine_key(device: torch.device, dtype: torch.dtype) -> dict[str, object]:
    """What a CPU measurement depends on: the CPU model, its bfloat16 flags, torch threads, dtype."""
    return {"device": device.type, "cpu": _cpu_model(), "bf16_flags": list(cpu_bf16_flags()),
            "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch.")}


def device_config(generator_for: Callable[[ReAnchorConfig], object], device: torch.device, dtype: torch.dtype,
                  drafter_folder: Path | None, pair_id: str, tokenizer: object | None,
                  cache_dir: Path | None = None, candidates: Sequence[ReAnchorConfig] = CPU_CANDIDATES,
                  progress: Callable[[str], None] | None = print) -> DeviceChoice:
    """The config for ``device`` (see the module docstring for the order it looks in).

    ``generator_for(config)`` builds a `SpeculativeGenerator` over the loaded pair (used only to
    measure); ``pair_id`` names the target/drafter pair in the cache key; ``drafter_folder`` is
    where a shipped ``device_defaults.json`` may be.
    """
    if device.type != "cpu":
        return DeviceChoice(PAPER_CONFIG, "paper")
    key = machine_key(device, dtype)
    shipped = shipped_choice(drafter_folder, key)
    if shipped is not None:
        return shipped
    path = (cache_dir or _cache_dir()) / f"{_digest({**key, 'pair': pair_id})}.json"
    if path.is_file():
        raw = json.loads(path.read_text())
        return DeviceChoice(_config(raw["config"]), "cached", raw.get("tokens_per_s"), raw.get("plain_tokens_per_s"))
    if tokenizer is None:
        return DeviceChoice(candidates[0], "default")  # nothing to measure with: the cost model's choice
    if progress:
        progress(f"Choosing CPU defaults for this machine: {len(candidates)} configurations, measured once "
                 f"(cached in {path.parent}) ...")
    prompts = [_chat_ids(tokenizer, p) for p in MEASURE_PROMPTS]
    choice = measure_candidates(generator_for, prompts, candidates)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "pair": pair_id, "config": _fields(choice.config),
                                "tokens_per_s": choice.tokens_per_s,
                                "plain_tokens_per_s": choice.plain_tokens_per_s}, indent=1) + "\n")
    return choice


def measure_candidates(generator_for: Callable[[ReAnchorConfig], object], prompts: Sequence[Sequence[int]],
                       candidates: Sequence[ReAnchorConfig], max_new_tokens: int = 32,
                       temperature: float = 0.0) -> DeviceChoice:
    """Decode ``prompts`` with plain decoding and with each candidate (method ``"reanchor"``,
    after one warm-up call each); the candidate with the most tokens per decode second wins.
    At ``temperature`` > 0 every method draws the same tokens (seeded draws: `TokenDraw`)."""
    sampling = {"temperature": temperature, "seed": 0} if temperature > 0 else {}

    def tokens_per_s(gen: object, method: str) -> float:
        gen.generate(prompts[0], 4, method=method)  # type: ignore[attr-defined]  # warm-up
        tokens, seconds = 0, 0.0
        for ids in prompts:
            t0 = time.perf_counter()
            out = gen.generate(ids, max_new_tokens, method=method, **sampling)  # type: ignore[attr-defined]
            seconds += time.perf_counter() - t0
            tokens += len(out.tokens)
        return tokens / seconds

    gens = [generator_for(c) for c in candidates]
    plain = tokens_per_s(gens[0], "target")
    speeds = [tokens_per_s(g, "reanchor") for g in gens]
    best = max(range(len(candidates)), key=speeds.__getitem__)
    return DeviceChoice(candidates[best], "measured", speeds[best], plain)


def fitting_candidates(drafter: torch.nn.Module, candidates: Sequence[ReAnchorConfig] = CPU_CANDIDATES
                       ) -> tuple[ReAnchorConfig, ...]:
    """``candidates`` made to fit ``drafter``: no ``draft_vocab`` where it has no draft vocabulary
    (or a smaller one), depth caps and offsets within its block."""
    ranking = getattr(drafter, "vocab_ranking", None)
    block = int(getattr(drafter, "block_size"))
    out = []
    for c in candidates:
        vocab = c.draft_vocab if ranking is not None and c.draft_vocab and c.draft_vocab <= len(ranking) else None
        depth = min(c.max_depth, block - 1) if c.max_depth else None
        offsets = tuple(d for d in c.offsets if d < block)
        out.append(c.replace(draft_vocab=vocab, max_depth=depth, offsets=offsets or (1,)))
    return tuple(dict.fromkeys(out))


def shipped_choice(folder: Path | None, key: dict[str, object]) -> DeviceChoice | None:
    """The choice ``folder``'s ``device_defaults.json`` holds for a machine of ``key`` (`machine_key`), or None."""
    if folder is None or not (folder / SHIPPED_FILE).is_file():
        return None
    file = folder / SHIPPED_FILE
    for entry in json.loads(file.read_text())["entries"]:
        if entry["key"] == key:
            config, served = _config(entry["config"]), entry.get("served") or {}
            unknown = sorted(set(served.get("config", {})) - set(SERVED_FIELDS))
            if unknown:
                raise ValueError(f"{file}: an entry's served.config may set {' and '.join(SERVED_FIELDS)} only, "
                                 f"got {unknown}")
            profiles: dict[str, Path | None] = {}
            for name in ("cost_profile", "cost_profile_packed"):
                profile = folder / served[name] if served.get(name) else None
                if profile is not None and not profile.is_file():
                    raise ValueError(f"{file}: served.{name} {served[name]!r} is not a file in {folder}")
                if profile is not None and served.get("config", {}).get("batch_node_budget") is not None:
                    raise ValueError(f"{file}: an entry's served.{name} and served.config.batch_node_budget "
                                     "both cap a batch's nodes; keep one")
                profiles[name] = profile
            # the speeds are those of the weights measured (the choice, a cost shape of the machine, stays valid)
            fresh = entry.get("drafter_sha256") in (None, _weights_sha256(folder))
            raw = entry.get("sampled")
            sampled = None if not raw else DeviceChoice(
                _config(raw["config"]), "shipped", raw.get("tokens_per_s") if fresh else None,
                raw.get("plain_tokens_per_s") if fresh else None)
            return DeviceChoice(config, "shipped", entry.get("tokens_per_s") if fresh else None,
                                entry.get("plain_tokens_per_s") if fresh else None,
                                served=config.replace(**served["config"]) if served.get("config") else None,
                                served_measured=str(served.get("measured", "")),
                                served_cost_profile=profiles["cost_profile"],
                                served_cost_profile_packed=profiles["cost_profile_packed"],
                                sampled=sampled)
    return None


def _weights_sha256(folder: Path) -> str:
    """The first 12 hex digits of the sha256 of ``folder``'s ``model.safetensors`` (an entry's
    ``drafter_sha256``; "" without one)."""
    weights = folder / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:12] if weights.is_file() else ""


def _fields(config: ReAnchorConfig) -> dict[str, object]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


def _config(raw: dict[str, object]) -> ReAnchorConfig:
    raw = dict(raw)
    raw["offsets"] = tuple(raw.get("offsets", ()))  # type: ignore[arg-type]
    return ReAnchorConfig(**raw)  # type: ignore[arg-type]


def _chat_ids(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True)["input_ids"])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _cache_dir() -> Path:
    from ..hub import cache_root

    return cache_root() / "device_defaults"


def pair_fingerprint(target: torch.nn.Module, drafter: torch.nn.Module) -> str:
    """A short id of a target/drafter pair: the target's name and size, a hash of the drafter's weights."""
    h = hashlib.sha256()
    for p in drafter.state_dict().values():
        h.update(p.detach().to(torch.float32).cpu().numpy().tobytes())
    name = getattr(getattr(target, "config", None), "_name_or_path", "") or type(target).__name__
    size = sum(p.numel() for p in target.parameters())
    return f"{Path(str(name)).name}-{size}-{h.hexdigest()[:12]}"
