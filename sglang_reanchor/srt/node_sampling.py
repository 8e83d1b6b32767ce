"""From SGLang's batch to the target's pick at every tree node: penalties, bias, sampling, seeds.

A verify forward scores every node of a draft tree at once. Each node must be
scored as plain decoding would score the same output, so:

- penalties (frequency, presence, repetition, min_new_tokens) use the history of
  the node's own path (`sglang_reanchor.penalties.penalize_tree`), computed from
  ``req.output_ids``. (SGLang's penalizer state is per request, one history for all
  nodes, and is not advanced by the speculative workers.)
- ``logit_bias`` is the same for every node;
- temperature, top-k, top-p and min-p follow SGLang's sampler
  (`sglang_reanchor.sampling.filtered_probs`);
- under ``--enable-deterministic-inference`` (where SGLang honours
  ``sampling_seed``), the draw is keyed by ``(seed, position)``
  (`sglang_reanchor.sampling.seeded_draw`): a seeded request is reproducible whatever
  the batch, the tree or the drafter.

Imports no SGLang module: it reads the attributes of SGLang's ``Req`` and
``SamplingBatchInfo`` objects it is given.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ..penalties import Penalties, history_counts, penalize_tree
from ..sampling import filtered_probs, sample_rows, seeded_draw
from ..tree import DraftTree

__all__ = ["adjust_node_logits", "emitted_support", "node_picks", "request_penalties"]


def _stop_ids(req: Any) -> set[int]:
    """The tokens ``min_new_tokens`` holds back (SGLang's ``BatchedMinNewTokensPenalizer`` set)."""
    ids = set(req.sampling_params.stop_token_ids or ()) | set(getattr(req, "eos_token_ids", None) or ())
    tok = getattr(req, "tokenizer", None)
    if tok is not None:
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(int(tok.eos_token_id))
    return {int(i) for i in ids if i is not None}


def request_penalties(reqs: Sequence[Any], vocab_size: int, device: torch.device | str) -> Penalties | None:
    """The penalties of ``reqs`` as tensors, or None when every request's are neutral."""
    params = [r.sampling_params for r in reqs]
    if all(p.frequency_penalty == 0 and p.presence_penalty == 0 and p.repetition_penalty == 1
           and (p.min_new_tokens or 0) == 0 for p in params):
        return None
    stop = torch.zeros(len(reqs), vocab_size, dtype=torch.bool)
    for b, r in enumerate(reqs):
        if params[b].min_new_tokens:
            ids = [i for i in _stop_ids(r) if 0 <= i < vocab_size]
            stop[b, ids] = True

    def vec(values: list, dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return Penalties(
        frequency=vec([float(p.frequency_penalty) for p in params], torch.float32),
        presence=vec([float(p.presence_penalty) for p in params], torch.float32),
        repetition=vec([float(p.repetition_penalty) for p in params], torch.float32),
        min_new_tokens=vec([int(p.min_new_tokens or 0) for p in params], torch.long),
        stop_mask=stop.to(device),
    )


def adjust_node_logits(logits: Tensor, tree: DraftTree, reqs: Sequence[Any], sampling_info: Any) -> Tensor:
    """``logits`` (``[bs, N, V]``) with each node's penalties and the logit bias applied."""
    if sampling_info is None:
        return logits
    penalties = request_penalties(reqs, logits.shape[-1], logits.device)
    if penalties is not None:
        outputs = [list(r.output_ids) for r in reqs]
        history = history_counts(outputs, logits.shape[-1], logits.device)
        lens = torch.tensor([len(o) for o in outputs], dtype=torch.long, device=logits.device)
        logits = penalize_tree(logits, tree, history, lens, penalties)
    bias = getattr(sampling_info, "logit_bias", None)
    if bias is not None:
        logits = logits + bias.to(logits.device, logits.dtype)[:, None, :]
    return logits


def node_picks(logits: Tensor, positions: Tensor, sampling_info: Any, generator: torch.Generator | None) -> Tensor:
    """The target's pick after every node, ``[bs, N]`` long.

    ``logits``: ``[bs, N, V]`` (adjusted); ``positions``: ``[bs, N]``, each node's
    position (the row follows that token). Greedy requests (``top_k == 1``, as
    SGLang encodes temperature 0) take the argmax.
    """
    bs, width, vocab = logits.shape
    temperature = sampling_info.temperatures.view(-1).float()
    top_k = sampling_info.top_ks.view(-1).long()
    greedy = top_k == 1
    top_k = torch.where(top_k < 1, vocab, top_k)  # -1 (unnormalised "all") keeps every token

    def per_node(x: Tensor) -> Tensor:
        return x.view(-1).repeat_interleave(width)

    probs = filtered_probs(
        logits.reshape(bs * width, vocab),
        per_node(torch.where(greedy, torch.ones_like(temperature), temperature)),
        per_node(top_k.clamp(max=vocab)),
        per_node(sampling_info.top_ps.view(-1).float()),
        per_node(sampling_info.min_ps.view(-1).float()),
    )
    seeds = getattr(sampling_info, "sampling_seed", None)
    if seeds is not None:
        picks = seeded_draw(probs, per_node(seeds.long()), positions.reshape(-1))
    else:
        picks = sample_rows(probs, generator)
    picks = picks.view(bs, width)
    return torch.where(greedy[:, None], logits.argmax(-1), picks)


def emitted_support(logits: Tensor, tokens: Tensor, sampling_info: Any, rows: Tensor,
                    max_support: int) -> tuple[Tensor, Tensor, Tensor]:
    """``return_sampling_mask``: the support each emitted token was drawn from, and its logprobs.

    ``logits``: ``[M, T, V]``, the target's (adjusted) row behind each of the ``T``
    emitted tokens ``tokens`` (``[M, T]``) of ``M`` requests, which are batch rows
    ``rows`` (``[M]``) of ``sampling_info``. The support is that of `node_picks`:
    the tokens `filtered_probs` gives mass to (temperature, top-k, top-p, min-p), or
    the argmax alone for a greedy request (``top_k == 1``), whose logprob is 0.

    Returns ``(support [M, T, K] int32, support_logprobs [M, T, K] float32,
    lengths [M, T] int32)`` with ``K = max_support`` (the largest ``top_k`` asked
    for): the ``lengths[m, t]`` most likely tokens, padding after them (-inf).
    """
    m, t, vocab = logits.shape
    top_k = sampling_info.top_ks.view(-1)[rows].long()
    greedy = top_k == 1
    temperature = sampling_info.temperatures.view(-1)[rows].float()

    def per_token(x: Tensor) -> Tensor:
        return x.view(-1).repeat_interleave(t)

    probs = filtered_probs(
        logits.reshape(m * t, vocab),
        per_token(torch.where(greedy, torch.ones_like(temperature), temperature)),
        per_token(torch.where(top_k < 1, vocab, top_k).clamp(max=vocab)),
        per_token(sampling_info.top_ps.view(-1)[rows].float()),
        per_token(sampling_info.min_ps.view(-1)[rows].float()),
    ).view(m, t, vocab)
    k = max(1, min(int(max_support), vocab))
    support_p, support = probs.topk(k, dim=-1)  # [M, T, K]
    lengths = (support_p > 0).sum(-1)
    logprobs = support_p.log()
    one = torch.arange(k, device=logits.device) == 0
    support = torch.where(greedy[:, None, None], torch.where(one, tokens[:, :, None], 0), support)
    logprobs = torch.where(greedy[:, None, None], torch.where(one, 0.0, -torch.inf), logprobs)
    lengths = torch.where(greedy[:, None], 1, lengths)
    return support.to(torch.int32), logprobs.float(), lengths.to(torch.int32)
