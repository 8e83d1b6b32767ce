"""Target sampling: temperature, top-k, top-p and min-p applied to logits, then one draw.

Speculative decoding stays lossless because every emitted token is drawn from
exactly these probabilities at the node it follows (see `verify.py`).

Two ways to draw:

- `sample_tokens` / `sample_rows`: ``torch.multinomial`` with a generator;
- `seeded_draw`: a request seed makes the draw a pure function of
  ``(seed, position, probabilities)`` (Gumbel-max with noise hashed from seed,
  position and token id). Nodes of a draft tree at the same depth share their
  noise, so a seeded speculative run emits exactly the tokens that seeded plain
  decoding emits, whatever the tree, the batch or the drafter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SamplingParams", "TokenDraw", "filtered_probs", "sample_rows", "sample_tokens", "seeded_draw", "target_probs"]


@dataclass(frozen=True)
class SamplingParams:
    """How the target picks a token. ``temperature == 0`` is greedy (argmax).

    ``top_k``: keep the ``k`` most likely tokens (None = all).
    ``top_p``: keep the smallest set whose probability reaches ``top_p`` (None = all).
    ``min_p``: then drop tokens below ``min_p`` times the most likely one's probability (None = keep).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a float >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or a float in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be None or a float in [0, 1], got {self.min_p!r}")

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
    if params.min_p:
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
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


def filtered_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """The probabilities SGLang's sampler draws from, one set of parameters per row, ``[M, V]`` float32.

    ``logits``: ``[M, V]``; ``temperature``, ``top_p``, ``min_p``: ``[M]`` float
    (> 0; ``top_p`` 1 and ``min_p`` 0 switch them off); ``top_k``: ``[M]`` long
    (>= V keeps all). SGLang's semantics (``top_k_top_p_min_p_sampling_from_probs_torch``):
    after the temperature, top-k keeps the ``k`` most likely tokens, top-p drops a
    token when the mass of the *whole* distribution before it exceeds ``top_p``,
    min-p drops tokens below ``min_p`` times the top probability; then renormalise.
    (`target_probs` renormalises between top-k and top-p, as Hugging Face does.)
    One sort serves every row: no loop per row.
    """
    probs = (logits.float() / temperature.float()[:, None]).softmax(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    drop = (rank[None] >= top_k[:, None]) | (sorted_p.cumsum(-1) - sorted_p > top_p.float()[:, None])
    drop |= sorted_p < min_p.float()[:, None] * sorted_p[:, :1]
    drop[:, 0] = False  # the most likely token always stays
    probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample_rows(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``probs`` (``[M, V]``), ``[M]`` long."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


_MASK32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash on int64 tensors (every product stays below 2**63)."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def _mix32_int32(x: Tensor) -> Tensor:
    """`_mix32` on int32 tensors, bit for bit (as unsigned), **in place** on ``x`` (a fresh ``[M, V]``
    array, the largest a draw hashes): products wrap modulo 2**32, and the masks make the arithmetic
    right shifts logical. Half the int64 version's bytes, and no temporaries of its size kept."""
    x ^= x.bitwise_right_shift(16).bitwise_and_(0xFFFF)
    x.mul_(0x7FEB352D)
    x ^= x.bitwise_right_shift(15).bitwise_and_(0x1FFFF)
    x.mul_(0x5BD1E995)
    x ^= x.bitwise_right_shift(16).bitwise_and_(0xFFFF)
    return x


def _as_int32(x: Tensor) -> Tensor:
    """int64 values in [0, 2**32) as the int32 with the same bits (explicitly: a cast of an
    out-of-range value is not defined to wrap)."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


@functools.lru_cache(maxsize=8)
def _vocab_hash(vocab: int, device: torch.device) -> Tensor:
    """``_mix32(id * 2 + c)`` for every token id, ``[V]`` int32 (the same for every draw: computed once)."""
    ids = torch.arange(vocab, device=device, dtype=torch.long)
    return _as_int32(_mix32(ids * 2 + 0x632BE5AB))


def seeded_draw(probs: Tensor, seeds: Tensor, positions: Tensor) -> Tensor:
    """One token per row of ``probs`` (``[M, V]``), a pure function of ``(seed, position, probs)``.

    ``seeds``, ``positions``: ``[M]`` long (the position is the one of the token
    the row follows). Gumbel-max, ``argmax(log p - log E)`` with ``E = -log u``
    and ``u`` hashed from ``(seed, position, token id)`` (32 bits), written as
    the exponential race ``argmax(p / E)``: one logarithm per token. It samples
    exactly ``probs``; rows with equal seed and position (siblings in a draft
    tree) share their noise, and a draw moves only where two tokens nearly tie,
    so numerics of a tree's verify against plain decoding's rarely change it.
    """
    seeds, positions = seeds.long(), positions.long()
    key = _mix32(_mix32(seeds ^ (seeds >> 32)) ^ _mix32(positions * 2 + 1))  # [M]
    bits = _mix32_int32(_as_int32(key)[:, None] ^ _vocab_hash(probs.shape[-1], probs.device)[None])  # [M, V]
    # the bits as unsigned (exact in float64), then u = (bits + 0.5) / 2**32 in (0, 1)
    uniform = bits.double().remainder_(2.0**32).add_(0.5).div_(2.0**32)
    return (probs.double() / uniform.log_().neg_()).argmax(-1)  # E = -log u > 0 and finite


@dataclass(frozen=True)
class TokenDraw:
    """How one request picks its tokens: `SamplingParams`, and a generator or a seed.

    With ``seed`` the draw is `seeded_draw` keyed by position, so the same seed
    gives the same tokens with plain decoding and with any speculative method.
    """

    params: SamplingParams
    generator: torch.Generator | None = None
    seed: int | None = None

    def __call__(self, logits: Tensor, positions: Tensor) -> Tensor:
        """One token per row: ``logits`` ``[M, V]``, ``positions`` ``[M]`` (of the token each row follows)."""
        if self.params.greedy:
            return logits.argmax(-1)
        probs = target_probs(logits, self.params)
        if self.seed is None:
            return sample_rows(probs, self.generator)
        return seeded_draw(probs, torch.full_like(positions, self.seed), positions)
