"""What a REANCHOR round returns beside its tokens: logprobs, sampling masks, hidden states, the trace.

Each is asked for per request and laid out the way SGLang's result processor reads a
DFlash chain: one row of ``stride`` emitted tokens per request, the first
``accept_len`` of them real. Emitted token ``j`` of a request is the target's pick
after its path node ``j`` (`CommitPlan.path_nodes`), so every per-token output is a
gather of that node's row from the verify forward.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import torch
from sglang.srt.layers.logits_processor import SamplingMaskOutput, SamplingMaskStatus
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.model_executor.forward_batch_info import (
    get_required_capture_hidden_mode,
    get_server_return_hidden_states_mode,
)

from ..round import CommitPlan
from ..tree import DraftTree
from ..verify import Acceptance
from .node_sampling import emitted_support

__all__ = ["RoundTiming", "attach_token_outputs", "emitted_hidden_states", "emitted_rows",
           "prefill_hidden_states", "write_trace"]


def emitted_rows(commit: CommitPlan) -> torch.Tensor:
    """``[bs, stride]`` long: the tree node behind each emitted token (its path node), in the
    scheduler's rows of ``stride`` per request; 0 past the path (rows the scheduler never reads)."""
    bs, stride = commit.out_tokens.shape
    depth = min(stride, commit.path_nodes.shape[1])
    rows = torch.zeros(bs, stride, dtype=torch.long, device=commit.path_nodes.device)
    rows[:, :depth] = commit.path_nodes[:, :depth]
    return rows


def attach_token_outputs(batch: Any, logits_output: Any, logits: torch.Tensor, commit: CommitPlan) -> None:
    """Logprobs and sampling masks of the emitted tokens into ``logits_output``, for the requests
    that asked (``logits``: ``[bs, N, V]``, each node's row as the sampler saw it: penalties,
    bias and grammar applied)."""
    if batch.return_logprob:
        _output_logprobs(batch, logits_output, logits, commit)
    info = batch.sampling_info
    if info is not None and info.sampling_mask_batch_indices is not None:
        logits_output.sampling_mask_output = _sampling_mask_output(info, logits, commit)


def _output_logprobs(batch: Any, logits_output: Any, logits: torch.Tensor, commit: CommitPlan) -> None:
    """The target's logprobs of the emitted tokens, as a plain server returns them: the emitted
    rows of ``logits``, laid out as a DFlash chain, go to SGLang's own `compute_spec_logprobs`
    (temperature, top logprobs, token-id logprobs)."""
    vocab = logits.shape[-1]
    rows = emitted_rows(commit)
    logits_output.next_token_logits = logits.gather(1, rows[:, :, None].expand(-1, -1, vocab)).reshape(-1, vocab)
    compute_spec_logprobs(batch, logits_output, commit.out_tokens.reshape(-1), chain_stride=rows.shape[1])


def _sampling_mask_output(info: Any, logits: torch.Tensor, commit: CommitPlan) -> SamplingMaskOutput:
    """``return_sampling_mask``: per emitted token of each request that asked, the support the
    target drew it from (`emitted_support`), ``num_accept_tokens`` of each row real."""
    selected = info.sampling_mask_batch_indices.long()
    rows = emitted_rows(commit)[selected]  # [M, T]
    tokens = commit.out_tokens[selected].long()
    vocab = logits.shape[-1]
    node_logits = logits[selected].gather(1, rows[:, :, None].expand(-1, -1, vocab))  # [M, T, V]
    support, logprobs, lengths = emitted_support(node_logits, tokens, info, selected,
                                                 max(info.sampling_mask_top_ks))
    real = torch.arange(support.shape[-1], device=support.device) < lengths[:, :, None]
    picked = (support == tokens[:, :, None]) & real
    selected_logprobs = torch.where(picked, logprobs, -torch.inf).amax(-1)  # -inf: not in its support
    capture = info.sampling_support_logprobs_capture_indices
    return SamplingMaskOutput(
        token_ids=support, lengths=lengths, selected_logprobs=selected_logprobs,
        support_logprobs=None if capture is None else logprobs.index_select(0, capture.long()),
        statuses=torch.where(torch.isfinite(selected_logprobs), int(SamplingMaskStatus.OK),
                             int(SamplingMaskStatus.INVALID)).to(torch.int8),
        num_accept_tokens=commit.commit_lens[selected].to(torch.int32),
    )


def emitted_hidden_states(logits_output: Any, commit: CommitPlan, bs: int, width: int) -> torch.Tensor | None:
    """``return_hidden_states``: the target's last hidden state behind each emitted token.

    As a plain server returns it (after the final norm, before the LM head), ``[bs * stride, H]``
    in rows of ``stride`` per request. The target's logits processor keeps them beside the
    drafter's aux features (``last_hidden_states``, switched on by the worker).
    """
    last = logits_output.last_hidden_states
    if last is None:
        return None
    rows = emitted_rows(commit)
    last = last.view(bs, width, -1)
    return last.gather(1, rows[:, :, None].expand(-1, -1, last.shape[-1])).reshape(rows.numel(), -1)


def prefill_hidden_states(batch: Any, logits_output: Any) -> torch.Tensor | None:
    """``return_hidden_states`` in a prefill: the prompt's last hidden states, as the scheduler
    will read them (every extended position, or each request's last under ``"last"`` capture)."""
    last = logits_output.last_hidden_states
    if last is None:
        return None
    mode = get_required_capture_hidden_mode(
        max(batch.return_hidden_states_mode, get_server_return_hidden_states_mode()), batch.spec_info)
    if mode.is_last():
        ends = torch.tensor(batch.extend_lens, dtype=torch.long, device=last.device).cumsum(0) - 1
        return last[ends]
    return last


class RoundTiming(NamedTuple):
    """A traced round's budget and time (host wall time: on a GPU, up to the trace's own reads)."""

    budget: int  # tree nodes per request it was allowed
    start: float  # time.perf_counter() at its start (seconds; compare within one server only)
    seconds: float  # from its start to the trace
    expected: dict[int, float] | None  # the cost budget's tokens/s per budget when it chose, if it has one


def write_trace(path: str, batch: Any, tree: DraftTree, acc: Acceptance, suffix_lens: torch.Tensor,
                timing: RoundTiming) -> None:
    """Append one JSON line per request to ``path``: this round's tree, acceptance and time
    (``$SGLANG_REANCHOR_TRACE``; a debugging aid, it reads the device every round).
    ``scripts/budget_trace.py`` sets what the budget expected beside what the rounds delivered."""
    path_rows = tree.source_row.gather(1, acc.accepted_nodes.clamp(min=0))
    on_path = acc.accepted_nodes >= 0
    with open(path, "a") as f:
        for b, req in enumerate(batch.reqs):
            f.write(json.dumps({
                "rid": req.rid,
                "batch": len(batch.reqs),
                "seq_len": int(batch.seq_lens[b]),
                "tau": int(acc.accept_lengths[b]),
                "nodes": int(tree.num_nodes[b]),
                "rows_attached": int((tree.row_sites[b] >= 0).sum()),
                "shifted_accepts": int(((path_rows[b] > 0) & on_path[b]).sum()),
                "suffix_len": int(suffix_lens[b]),
                "budget": timing.budget,
                "round_start": timing.start,
                "round_s": timing.seconds,
                "expected": None if timing.expected is None else {str(k): v for k, v in timing.expected.items()},
            }) + "\n")
