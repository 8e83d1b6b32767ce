"""ReAnchor's serving settings: where they come from and what SGLang must reserve for them.

SGLang's command line has no field for an algorithm plugin's own settings, so the
`ReAnchorConfig` of a server is read from the environment of the process that
launches it (spawned scheduler processes inherit it)::

    SGLANG_REANCHOR_CONFIG='{"offsets": [1, 2], "node_budget": 32}' \\
        python -m sglang.launch_server --speculative-algorithm REANCHOR ...
    SGLANG_REANCHOR_CONFIG=/path/to/reanchor.json python -m sglang.launch_server ...

The value is a JSON object, or the path of a file holding one. Keys are the fields
of `ReAnchorConfig`; unset keys keep its defaults. An unknown key or a bad value
raises `ValueError` naming the field.

Unset, the server takes the defaults that pay on its device (`served_config`): on a
GPU the paper's configuration (``ReAnchorConfig()``); on a CPU the choice the drafter
folder ships for a CPU of this kind (``device_defaults.json``, the reference engine's
`sglang_reanchor.engine.defaults`, with the entry's ``served`` fields, measured under load, on
top: ``batch_node_budget``, or a cost profile of the machine kind for the batch-aware budget),
else the paper's configuration too, saying so once.
The launcher resolves it and writes it to ``$SGLANG_REANCHOR_CONFIG`` (a shipped cost profile's
path to ``$SGLANG_REANCHOR_COST_PROFILE``), so the scheduler processes it spawns serve exactly what
it reserved room for.

Nothing here imports SGLang.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from ..config import ReAnchorConfig
from ..round import RoundCore

__all__ = ["COST_PROFILE_ENV", "ENV_VAR", "ServedConfig", "ServingWidths", "config_json", "load_config", "parse_config", "served_config",
           "serving_widths"]

ENV_VAR = "SGLANG_REANCHOR_CONFIG"
COST_PROFILE_ENV = "SGLANG_REANCHOR_COST_PROFILE"  # a `bench cost` profile: the batch-aware node budget


def parse_config(text: str) -> ReAnchorConfig:
    """A `ReAnchorConfig` from a JSON object (a string), or from the JSON file it names.

    >>> parse_config('{"offsets": [2, 1], "node_budget": 32}').offsets
    (1, 2)
    >>> parse_config('{"ofsets": [1]}')
    Traceback (most recent call last):
    ...
    ValueError: SGLANG_REANCHOR_CONFIG: unknown field 'ofsets'; fields are offsets, policy, root_site, fallback, node_budget, region, batch_node_budget, disable_by_batch_size, max_depth, draft_slots, branch_width, branch_rows, branch_length, branch_shape, branch_temperature, draft_vocab, verify_threshold, max_requests, seed
    >>> parse_config('{"verify_threshold": 0.3}').verify_threshold
    0.3
    """
    source = text.strip()
    if not source.startswith("{"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"{ENV_VAR}: {source!r} is neither a JSON object nor an existing file")
        source = path.read_text()
    try:
        raw = json.loads(source)
    except json.JSONDecodeError as err:
        raise ValueError(f"{ENV_VAR}: invalid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{ENV_VAR}: expected a JSON object, got {type(raw).__name__}")
    names = [f.name for f in fields(ReAnchorConfig)]
    for key in raw:
        if key not in names:
            raise ValueError(f"{ENV_VAR}: unknown field {key!r}; fields are {', '.join(names)}")
    if isinstance(raw.get("offsets"), list):
        raw["offsets"] = tuple(raw["offsets"])
    return ReAnchorConfig(**raw)


def load_config(environ: Mapping[str, str] | None = None) -> ReAnchorConfig:
    """The config in ``$SGLANG_REANCHOR_CONFIG`` (defaults when unset or empty)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return parse_config(value) if value.strip() else ReAnchorConfig()


def config_json(config: ReAnchorConfig) -> str:
    """``config`` as the JSON object `parse_config` reads back.

    >>> parse_config(config_json(ReAnchorConfig(offsets=(1,), node_budget=6))) == ReAnchorConfig(offsets=(1,), node_budget=6)
    True
    """
    raw = {f.name: getattr(config, f.name) for f in fields(ReAnchorConfig)}
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in raw.items()}, sort_keys=True)


@dataclass(frozen=True)
class ServedConfig:
    """The config a server runs and where it came from: ``"env"`` (``$SGLANG_REANCHOR_CONFIG``),
    ``"paper"`` (a GPU), ``"shipped"`` (the drafter folder's entry for this CPU kind) or
    ``"paper-cpu"`` (a CPU without one: the paper's, which is slow there); ``note`` says so in words."""

    config: ReAnchorConfig
    source: str
    note: str
    cost_profile: str | None = None  # a shipped cost profile for the batch-aware budget (`COST_PROFILE_ENV`)


def served_config(device: str, dtype: str, drafter_folder: str | None, tp_size: int = 1, full_vocab_only: bool = False,
                  environ: Mapping[str, str] | None = None, packed_linears: bool = False) -> ServedConfig:
    """The config to serve (module docstring): ``$SGLANG_REANCHOR_CONFIG`` when set, else by device.

    ``dtype``: what the target runs in (``"float32"``, ``"bfloat16"``, ...); ``drafter_folder``: a
    local folder (a hub id ships nothing); ``tp_size`` > 1 drops the shipped choice's ``draft_vocab``,
    branching and ``verify_threshold``, ``full_vocab_only`` (a Domino or DSpark drafter) its
    ``draft_vocab``, which those servers do not run;
    ``packed_linears``: the server packs its float32 linears (`packed_linears`), and budgets its
    batches with the entry's profile measured so (``served.cost_profile_packed``) where it has one.

    >>> served_config("cuda", "bfloat16", None, environ={}).source
    'paper'
    >>> served_config("cpu", "float32", None, environ={"SGLANG_REANCHOR_CONFIG": '{"node_budget": 6}'}).config.node_budget
    6
    """
    env = os.environ if environ is None else environ
    if env.get(ENV_VAR, "").strip():
        return ServedConfig(load_config(env), "env", f"{ENV_VAR} as set")
    paper = ReAnchorConfig()
    if not str(device).startswith("cpu"):
        return ServedConfig(paper, "paper", "the paper's configuration (a GPU)")
    import torch

    from ..engine.defaults import machine_key, shipped_choice

    folder = Path(drafter_folder) if drafter_folder and Path(drafter_folder).is_dir() else None
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    choice = (shipped_choice(folder, machine_key(torch.device("cpu"), dtypes[dtype]))
              if folder is not None and dtype in dtypes else None)
    if choice is None:
        return ServedConfig(paper, "paper-cpu", (
            f"no CPU defaults ship with this drafter for this CPU and dtype {dtype}: the paper's configuration, "
            f"tuned for GPUs and slow on a CPU; write them with `python scripts/ship_device_defaults.py`, "
            f"or set {ENV_VAR} (for example '{{\"offsets\": [1], \"node_budget\": 6, \"max_depth\": 3}}')"))
    # the served fields measured under load (batch_node_budget, a cost profile); a cost profile of
    # the user's ($SGLANG_REANCHOR_COST_PROFILE) replaces them
    own_profile = bool(env.get(COST_PROFILE_ENV, "").strip())
    config = choice.config if own_profile else (choice.served or choice.config)
    if tp_size != 1:  # what reads the whole LM head on one rank (the worker's `_check_tp`)
        config = config.replace(draft_vocab=None, branch_width=0, verify_threshold=None)
    if full_vocab_only:
        config = config.replace(draft_vocab=None)
    speed = (f" ({choice.tokens_per_s:g} tokens/s against {choice.plain_tokens_per_s:g} plain in the reference engine)"
             if choice.tokens_per_s and choice.plain_tokens_per_s else "")
    where = f"(measured under load: {choice.served_measured or 'the entry says not where'})"
    profile = None
    if own_profile:
        speed += f", each round's budget chosen for the batch from ${COST_PROFILE_ENV}"
    elif packed_linears and choice.served_cost_profile_packed is not None:
        profile = str(choice.served_cost_profile_packed)
        speed += (f", each round's budget chosen for the batch from the shipped cost profile {profile}, measured with "
                  f"packed linears as this server runs them {where}")
    elif choice.served_cost_profile is not None:
        profile = str(choice.served_cost_profile)
        speed += f", each round's budget chosen for the batch from the shipped cost profile {profile} {where}"
    elif choice.served is not None and choice.served.batch_node_budget is not None:
        speed += f", batch_node_budget {choice.served.batch_node_budget} for batches {where}"
    elif config.batch_node_budget is None:
        # nothing measured under load: a batch shares one request's tree (a batch of node_budget
        # requests or more verifies its roots alone, a plain decode step), not node_budget each
        config = config.replace(batch_node_budget=config.node_budget)
        speed += (f", batch_node_budget {config.node_budget} for batches (the tree's own size: the entry has "
                  "nothing measured under load)")
    if not own_profile and config.disable_by_batch_size is not None:
        speed += f", the roots alone in batches of more than {config.disable_by_batch_size} {where}"
    return ServedConfig(config, "shipped", f"the drafter folder's defaults for this CPU{speed}", profile)


@dataclass(frozen=True)
class ServingWidths:
    """Per-request token counts of one ReAnchor step inside SGLang.

    ``draft_queries`` query tokens run through the drafter (``1 + R`` blocks of
    ``B`` slots: the config's ``draft_slots``, else the drafter's block size) after
    ``extra_rows`` rejected-suffix context rows; ``verify_nodes`` tree
    nodes run through the target. Both windows are written into the slots SGLang
    reserves ahead of each request's committed tokens. SGLang's rule for that
    (``allocation_sizing.get_alloc_len_per_decode``, page size 1, top-k 1): one
    decode step may allocate ``speculative_num_draft_tokens`` slots per request, so
    ``reserve_width`` (what that argument is set to) is the wider of the two
    windows. ``DFlashDraftInputV2.prepare_for_decode`` reserves twice that (a
    double buffer for overlap scheduling's lag), which nothing here relies on; the
    worker checks every round that the slots it writes are reserved.
    """

    block_size: int  # B: query slots per drafted block, anchor included
    num_rows: int  # 1 + R: the baseline block and one per offset
    extra_rows: int  # X = max(offsets)
    draft_queries: int  # (1 + R) * B
    verify_nodes: int  # node budget N (upper bound of the tree width)
    reserve_width: int  # speculative_num_draft_tokens = max(X + Q, N)

    @property
    def draft_columns(self) -> int:
        """``X + Q``: req_to_token columns the draft window writes past ``s``."""
        return self.extra_rows + self.draft_queries

    output_stride: int  # most tokens one request commits in a round (`RoundCore.min_stride`)


def serving_widths(config: ReAnchorConfig, block_size: int) -> ServingWidths:
    """Widths for a drafter of block size ``block_size`` (each drafted block runs ``config.draft_slots``
    of its slots, or all of them).

    >>> w = serving_widths(ReAnchorConfig(), 16)
    >>> w.draft_queries, w.extra_rows, w.verify_nodes, w.reserve_width, w.output_stride
    (64, 3, 48, 67, 32)
    >>> w = serving_widths(ReAnchorConfig(offsets=(1,), node_budget=6, draft_slots=4), 16)
    >>> w.block_size, w.draft_queries, w.reserve_width
    (4, 8, 9)
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    if config.draft_slots is not None and config.draft_slots > block_size:
        raise ValueError(f"ReAnchorConfig.draft_slots ({config.draft_slots}) exceeds the drafter's block_size "
                         f"({block_size}); allowed: 2 .. {block_size}, or null for the whole block")
    slots = config.draft_slots or block_size
    rows = 1 + len(config.offsets)
    extra = config.max_offset
    queries = rows * slots
    nodes = config.node_budget
    drafts = min(config.max_depth or slots - 1, slots - 1)
    stride = RoundCore.min_stride(config, drafts, max_nodes=nodes)
    return ServingWidths(slots, rows, extra, queries, nodes, max(nodes, extra + queries), stride)
