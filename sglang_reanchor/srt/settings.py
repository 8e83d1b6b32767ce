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

Nothing here imports SGLang.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from ..config import ReAnchorConfig
from ..round import RoundCore

__all__ = ["ENV_VAR", "ServingWidths", "load_config", "parse_config", "serving_widths"]

ENV_VAR = "SGLANG_REANCHOR_CONFIG"
UNSERVED_FIELDS = ("draft_slots",)


def parse_config(text: str) -> ReAnchorConfig:
    """A `ReAnchorConfig` from a JSON object (a string), or from the JSON file it names.

    >>> parse_config('{"offsets": [2, 1], "node_budget": 32}').offsets
    (1, 2)
    >>> parse_config('{"ofsets": [1]}')
    Traceback (most recent call last):
    ...
    ValueError: SGLANG_REANCHOR_CONFIG: unknown field 'ofsets'; fields are offsets, policy, root_site, fallback, node_budget, region, batch_node_budget, max_depth, branch_width, branch_rows, branch_length, branch_temperature, draft_vocab, max_requests, seed
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
    # draft_slots is the reference engine's: SGLang's draft window runs whole blocks
    names = [f.name for f in fields(ReAnchorConfig) if f.name not in UNSERVED_FIELDS]
    for key in raw:
        if key in UNSERVED_FIELDS:
            raise ValueError(f"{ENV_VAR}: {key!r} is not served (the SGLang draft window runs whole blocks); "
                             f"fields are {', '.join(names)}")
        if key not in names:
            raise ValueError(f"{ENV_VAR}: unknown field {key!r}; fields are {', '.join(names)}")
    if isinstance(raw.get("offsets"), list):
        raw["offsets"] = tuple(raw["offsets"])
    return ReAnchorConfig(**raw)


def load_config(environ: dict[str, str] | None = None) -> ReAnchorConfig:
    """The config in ``$SGLANG_REANCHOR_CONFIG`` (defaults when unset or empty)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return parse_config(value) if value.strip() else ReAnchorConfig()


@dataclass(frozen=True)
class ServingWidths:
    """Per-request token counts of one ReAnchor step inside SGLang.

    ``draft_queries`` query tokens run through the drafter (``1 + R`` blocks of
    ``B``) after ``extra_rows`` rejected-suffix context rows; ``verify_nodes`` tree
    nodes run through the target. Both windows are written into the slots SGLang
    reserves ahead of each request's committed tokens. SGLang's rule for that
    (``allocation_sizing.get_alloc_len_per_decode``, page size 1, top-k 1): one
    decode step may allocate ``speculative_num_draft_tokens`` slots per request, so
    ``reserve_width`` (what that argument is set to) is the wider of the two
    windows. ``DFlashDraftInputV2.prepare_for_decode`` reserves twice that (a
    double buffer for overlap scheduling's lag), which nothing here relies on; the
    worker checks every round that the slots it writes are reserved.
    """

    block_size: int  # B
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
    """Widths for a drafter of block size ``block_size``.

    >>> w = serving_widths(ReAnchorConfig(), 16)
    >>> w.draft_queries, w.extra_rows, w.verify_nodes, w.reserve_width, w.output_stride
    (64, 3, 48, 67, 32)
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    rows = 1 + len(config.offsets)
    extra = config.max_offset
    queries = rows * block_size
    nodes = config.node_budget
    drafts = min(config.max_depth or block_size - 1, block_size - 1)
    stride = RoundCore.min_stride(config, drafts, max_nodes=nodes)
    return ServingWidths(block_size, rows, extra, queries, nodes, max(nodes, extra + queries), stride)
