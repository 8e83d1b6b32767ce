"""`DraftKVBacklog`: the draft-KV writes of root-alone rounds, held and written in one call.

A batch that verifies its roots alone (``disable_by_batch_size``, a big batch's budget)
decodes as plainly as SGLang does, but each round still owes the drafter its committed
token: the target's features at that column, projected into the draft KV (the
drafter's ``fc`` and every layer's K/V projection). Nothing reads those rows until a
round drafts again, so the worker holds them here and writes a run of rounds in one
call: one GEMM over ``bs * k`` rows instead of ``k`` GEMMs over ``bs`` rows each, and
none at all while nothing drafts.

Why holding is safe. A held row's slot belongs to a request of the held batch; the
rows are written before this worker's next forward of anything else (`flush` at every
call that is not a root-alone round of the same requests), so

- every draft-KV read of those columns (a drafting round, a prefill that matches the
  radix cache's copy of a finished request) comes after the write;
- a slot a finished request freed is written first by its next owner in a later
  forward of this worker, which finds the backlog already written (no late write
  over a new owner's row).

Pure torch (no SGLang import): the worker passes its draft-KV writer.
"""

from __future__ import annotations

from typing import Protocol

import os

import torch

__all__ = ["BACKLOG_ENV", "DEFAULT_BACKLOG_BYTES", "DraftKVBacklog", "DraftKVWriter", "backlog_bytes_from_env"]

BACKLOG_ENV = "SGLANG_REANCHOR_DRAFT_KV_BACKLOG_MB"  # MiB of held features; 0 writes every round at once
DEFAULT_BACKLOG_BYTES = 64 << 20


def backlog_bytes_from_env() -> int:
    """``$SGLANG_REANCHOR_DRAFT_KV_BACKLOG_MB`` in bytes (unset: 64 MiB).

    >>> os.environ[BACKLOG_ENV] = "0"; backlog_bytes_from_env()
    0
    >>> os.environ[BACKLOG_ENV] = "-1"; backlog_bytes_from_env()
    Traceback (most recent call last):
    ...
    ValueError: $SGLANG_REANCHOR_DRAFT_KV_BACKLOG_MB must be a whole number of MiB >= 0 (0: no backlog), got '-1'
    >>> del os.environ[BACKLOG_ENV]; backlog_bytes_from_env() == DEFAULT_BACKLOG_BYTES
    True
    """
    raw = os.environ.get(BACKLOG_ENV, "").strip()
    if not raw:
        return DEFAULT_BACKLOG_BYTES
    if not raw.isdigit():
        raise ValueError(f"${BACKLOG_ENV} must be a whole number of MiB >= 0 (0: no backlog), got {raw!r}")
    return int(raw) << 20


class DraftKVWriter(Protocol):
    """SGLang DFlash's prefix-valid draft-KV writer (``_append_target_hidden_to_draft_kv_by_loc``)."""

    def __call__(self, *, target_hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor,
                 cache_loc_2d: torch.Tensor, commit_lens: torch.Tensor) -> None: ...


class DraftKVBacklog:
    """Root-alone rounds' committed rows of one batch of requests, in round order.

    ``write`` is the draft-KV writer; ``max_bytes`` caps the held features (0: every
    round writes at once, as without a backlog).
    """

    def __init__(self, write: DraftKVWriter, max_bytes: int = DEFAULT_BACKLOG_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 holds nothing), got {max_bytes}")
        self._write = write
        self._max_bytes = max_bytes
        self._requests: tuple[str, ...] | None = None  # the held rows' requests (rids, batch order)
        self._hidden: list[torch.Tensor] = []  # per round [bs, F]
        self._loc: list[torch.Tensor] = []  # per round [bs] draft-KV slot ids
        self._positions: list[torch.Tensor] = []  # per round [bs]
        self._bytes = 0

    @property
    def rounds(self) -> int:
        """Rounds held (0 after a flush)."""
        return len(self._hidden)

    def hold(self, requests: tuple[str, ...], hidden: torch.Tensor, loc: torch.Tensor,
             positions: torch.Tensor) -> None:
        """One root-alone round: ``hidden`` ``[bs, F]`` the committed tokens' target features,
        ``loc`` ``[bs]`` their draft-KV slots, ``positions`` ``[bs]``, for ``requests`` (``bs``
        rids in batch order). Another batch's rows are written first; past the cap, all are."""
        if requests != self._requests:
            self.flush()
            self._requests = requests
        self._hidden.append(hidden)
        self._loc.append(loc)
        self._positions.append(positions)
        self._bytes += hidden.numel() * hidden.element_size()
        if self._bytes >= self._max_bytes:
            self.flush()

    def flush(self) -> None:
        """Write every held row (one writer call, request-major ``[bs, k]``) and hold nothing."""
        if self._hidden:
            hidden = torch.stack(self._hidden, dim=1)  # [bs, k, F]
            loc = torch.stack(self._loc, dim=1)  # [bs, k]
            bs, k, dim = hidden.shape
            self._write(target_hidden=hidden.reshape(bs * k, dim), cache_loc=loc.reshape(-1),
                        positions=torch.stack(self._positions, dim=1).reshape(-1), cache_loc_2d=loc,
                        commit_lens=torch.full((bs,), k, dtype=torch.int32, device=loc.device))
        self._requests = None
        self._hidden, self._loc, self._positions = [], [], []
        self._bytes = 0
