"""Target sampling: temperature, top-k and top-p applied to logits, then one draw.

Speculative decoding stays lossless because every emitted token is drawn from
exactly these probabilities at the node it follows (see `verify.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SamplingParams", "sample_tokens", "target_probs"]


@dataclass(frozen=True)
class SamplingParams:
    """How the target picks a token. ``temperature == 0`` is greedy (argmax).

    ``top_k``: keep the ``k`` most likely tokens (None = all).
    ``top_p``: keep the smallest set whose probability reaches ``top_p`` (None = all).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a float >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or a float in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Probabilities the target samples from, ``[..., V]`` float32 (``logits``: ``[..., V]``).

    Greedy params give a one-hot of the argmax.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scaled = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, -float("inf"))
    probs = scaled.softmax(-1)
    if params.top_p is not None and params.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep a token if the mass strictly before it is below top_p (the top token always stays).
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_tokens(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``logits`` (``[..., V]``), returned as ``[...]`` long."""
    if params.greedy:
        return logits.argmax(-1)
    probs = target_probs(logits, params)
    flat = probs.reshape(-1, probs.shape[-1])
    # multinomial's generator must live on the probabilities' device.
    draws = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return draws.reshape(probs.shape[:-1])
