"""Drafting over the target's most frequent tokens only (a reduced draft vocabulary).

The drafter borrows the target's LM head, and on a CPU that head is most of a drafter
forward: SmolLM2's is 49,152 x 576, and ReAnchor runs it over ``(1 + R) * B`` query
rows per round (64 with the defaults, ~11 ms in bfloat16 here). A draft outside the
tokens the target actually writes is almost never accepted, so the argmax may run
over the ``K`` tokens the target emits most often (the idea of FR-Spec, Zhao et al.
2025, arXiv 2502.14856): ``K / V`` of the head's work. Losslessness does not depend
on the drafts at all (verification decides every token), so this changes only which
drafts are proposed, never the output.

A drafter folder may carry ``draft_vocab.safetensors`` (tensor ``token_ids``: every
token seen in the target's training responses, most frequent first; written by
``python -m sglang_reanchor.train draft-vocab``); `DFlashDrafter.from_pretrained` keeps it
as ``drafter.vocab_ranking``. Nothing drafts with it unless asked:
``SpeculativeGenerator(..., draft_vocab=drafter.vocab_ranking[:K])``, or the benchmark's
``METHOD:draft_vocab=K``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

__all__ = ["DRAFT_VOCAB_FILE", "DraftVocabHead", "load_draft_vocab", "rank_tokens", "save_draft_vocab", "top_tokens"]

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


class DraftVocabHead(nn.Module):
    """The rows ``token_ids`` of an LM head: logits over ``K`` tokens, and the map back.

    ``forward(hidden [.., H]) -> [.., K]``; ``token_ids[argmax]`` is the draft token.
    The rows are copied once (``[K, H]``), so a round reads only them.
    """

    token_ids: Tensor  # [K] long (buffer)
    weight: Tensor  # [K, H] (buffer)
    bias: Tensor | None  # [K] (buffer)

    def __init__(self, lm_head: nn.Module, token_ids: Tensor) -> None:
        super().__init__()
        weight = lm_head.weight
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError(f"token_ids must be a non-empty 1-D tensor, got shape {tuple(token_ids.shape)}")
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= weight.shape[0]:
            raise ValueError(f"token_ids must lie in [0, {weight.shape[0] - 1}] (the LM head's vocabulary)")
        if torch.unique(token_ids).numel() != token_ids.numel():
            raise ValueError("token_ids holds a token twice")
        ids = token_ids.to(device=weight.device, dtype=torch.long)
        self.register_buffer("token_ids", ids, persistent=False)
        self.register_buffer("weight", weight.detach()[ids].clone(), persistent=False)
        bias = getattr(lm_head, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach()[ids].clone(), persistent=False)

    def forward(self, hidden: Tensor) -> Tensor:
        return nn.functional.linear(hidden, self.weight, self.bias)


def rank_tokens(token_ids: Tensor, vocab_size: int, always: tuple[int, ...] = ()) -> Tensor:
    """Every token that occurs in ``token_ids`` (any shape), most frequent first (ties:
    lower id first), with ``always`` (e.g. EOS) put in front. ``[n]`` long."""
    counts = torch.bincount(token_ids.reshape(-1).long(), minlength=vocab_size)[:vocab_size]
    for t in always:
        counts[t] = counts.max() + 1  # first, whatever the data says
    seen = (counts > 0).nonzero().squeeze(1)
    # stable sort by count descending keeps ascending ids among equal counts
    order = torch.sort(counts[seen], descending=True, stable=True).indices
    return seen[order]


def save_draft_vocab(folder: str | Path, ranking: Tensor) -> Path:
    """Write ``ranking`` (``[n]``, most frequent first) as the folder's draft vocabulary."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    save_file({"token_ids": ranking.to(torch.int32).contiguous()}, str(path))
    return path


def load_draft_vocab(folder: str | Path, size: int | None = None) -> Tensor:
    """A drafter folder's ranked draft vocabulary, ``[n]`` long (the ``size`` most
    frequent tokens when given). Raises if the folder has none, or fewer than ``size``."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no draft vocabulary (write one with "
                                "`python -m sglang_reanchor.train draft-vocab`)")
    return top_tokens(load_file(str(path))["token_ids"].long(), size, str(path))


def top_tokens(ranking: Tensor, size: int | None, where: str = "the ranking") -> Tensor:
    """The first ``size`` tokens of ``ranking`` (all when None), checked."""
    if size is None:
        return ranking
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= ranking.numel():
        raise ValueError(f"draft_vocab size must be an int in [1, {ranking.numel()}] for {where}, got {size!r}")
    return ranking[:size]
