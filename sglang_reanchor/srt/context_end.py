"""Near the end of a request's ``req_to_token`` row: what one round may write there.

Each request owns one row of SGLang's ``req_to_token`` (``[pool size, W_row]``,
``W_row`` = context length + SGLang's spec headroom). A ReAnchor round writes the
columns ``s .. s + X + Q - 1`` (draft window) and ``s .. s + width - 1`` (verify
tree) past its ``s`` committed tokens (`layout`). Near the row's end they shrink
to the room left (`round_room`): a request whose whole draft window does not fit
is not drafted (its tree is the root alone: one verified token, plain decoding),
and every tree of the batch is cut to the smallest room (padding nodes of a
batched verify occupy columns up to the batch's width on every request). The
output is unchanged: acceptance is exact on any tree.

SGLang itself, reserving ``2 * speculative_num_draft_tokens`` slots ahead of each
request (``DFlashDraftInputV2.prepare_for_decode``), writes that reservation into
``req_to_token`` with no bound at the row's end; past it the write lands in the
next request's row, and those slots are never freed (the scheduler's idle check
then stops the server: "pool memory leak detected"). `_alloc_lens_within_row` caps the reservation at the row's
end (an AROUND hook on ``page_aligned_decode_alloc_lens``, registered by `seam`), in REANCHOR processes only; the worker
tells it the row width (`set_row_width`) when it first sees a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["RoundRoom", "check_reserved", "reserved_columns", "round_room", "set_row_width"]

_row_width: int | None = None


def _alloc_lens_within_row(original: Any, reqs: Any, *args: Any, **kwargs: Any) -> Any:
    cur, nxt, _ = original(reqs, *args, **kwargs)
    if _row_width is None:
        raise RuntimeError("REANCHOR: the reservation cap ran before the worker set the req_to_token row width")
    # per request (as SGLang's own loop): never past the row, never below what is already held
    capped = [max(c, min(n, _row_width)) for c, n in zip(cur, nxt)]
    return cur, capped, sum(n - c for c, n in zip(cur, capped))



def set_row_width(row_width: int) -> None:
    """The ``req_to_token`` row width (known once SGLang has built its pools, before any decode)."""
    global _row_width
    _row_width = int(row_width)


@dataclass(frozen=True)
class RoundRoom:
    """What a round may write per request (host tensors: decided before any forward)."""

    room: Tensor  # [bs] long: req_to_token columns left past s (row width - s)
    drafted: Tensor  # [bs] bool: the whole draft window (X + Q columns) fits
    node_caps: Tensor  # [bs] long: most tree nodes verified (1 where not drafted)
    writes: Tensor  # [bs] long: columns past s this round may write (draft window and tree)


def round_room(seq_lens_cpu: Tensor, row_width: int, draft_columns: int, node_budget: int) -> RoundRoom:
    """Shrink the round to the room left in each request's row.

    ``seq_lens_cpu``: ``[bs]`` committed tokens ``s``; ``draft_columns`` = ``X + Q``.

    >>> r = round_room(torch.tensor([10, 58, 63]), 64, draft_columns=5, node_budget=4)
    >>> r.room.tolist(), r.drafted.tolist(), r.node_caps.tolist(), r.writes.tolist()
    ([54, 6, 1], [True, True, False], [1, 1, 1], [5, 5, 1])
    >>> round_room(torch.tensor([10, 20]), 64, 5, 4).node_caps.tolist()
    [4, 4]
    """
    room = row_width - seq_lens_cpu.long()
    if bool((room < 1).any()):
        b = int(room.argmin())
        raise RuntimeError(f"REANCHOR: request {b} has {int(seq_lens_cpu[b])} committed tokens, no req_to_token "
                           f"column left in its row of {row_width}")
    # a round that may verify the root alone (node_budget 1, e.g. a big batch's share of
    # batch_node_budget) has no use for drafts: skip the drafter for it
    drafted = (room >= draft_columns) & (node_budget > 1)
    cap = min(node_budget, int(room.min()))
    node_caps = torch.where(drafted, cap, 1)
    writes = torch.maximum(torch.where(drafted, draft_columns, 0), node_caps.max().expand_as(room))
    return RoundRoom(room=room, drafted=drafted, node_caps=node_caps, writes=writes)


def reserved_columns(reqs: Any, seq_lens_cpu: Tensor) -> Tensor:
    """``[bs]`` long (host): KV slots SGLang holds for each request past its ``s`` committed tokens.

    ``reqs``: the batch's SGLang ``Req`` objects (``req.kv.kv_allocated_len``, set
    by the reservation; one read per request, not per token).
    """
    allocated = torch.tensor([int(r.kv.kv_allocated_len) for r in reqs], dtype=torch.long)
    return allocated - seq_lens_cpu.long()


def check_reserved(reserved: Tensor, writes: Tensor, reqs: Sequence[Any]) -> None:
    """Fail, naming the request, if a round would write more columns than SGLang reserved.

    ``reserved``, ``writes``: ``[bs]`` long (host), counted past ``s``; ``reqs``: the
    batch's ``Req`` objects (or names), read only to name the one that fails.

    >>> check_reserved(torch.tensor([70, 70]), torch.tensor([35, 35]), ["a", "b"])
    >>> check_reserved(torch.tensor([70, 34]), torch.tensor([35, 35]), ["a", "b"])
    Traceback (most recent call last):
    ...
    RuntimeError: REANCHOR: request 'b' has 34 KV slots reserved past its committed tokens, but this round writes 35 (req_to_token columns s .. s+34); SGLang reserves per request from --speculative-num-draft-tokens, which must be at least max(X + Q, node_budget) (ServingWidths.reserve_width)
    """
    short = reserved < writes
    if bool(short.any()):
        b = int(short.nonzero()[0, 0])
        raise RuntimeError(
            f"REANCHOR: request {getattr(reqs[b], 'rid', reqs[b])!r} has {int(reserved[b])} KV slots reserved past its committed tokens, "
            f"but this round writes {int(writes[b])} (req_to_token columns s .. s+{int(writes[b]) - 1}); SGLang "
            f"reserves per request from --speculative-num-draft-tokens, which must be at least "
            f"max(X + Q, node_budget) (ServingWidths.reserve_width)"
        )
