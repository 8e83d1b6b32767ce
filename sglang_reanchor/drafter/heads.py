"""Draft heads: how a drafter turns its block hidden states into draft tokens.

A DFlash-family drafter runs one forward over each block ``[anchor, MASK x (W-1)]``
(`multi_anchor.draft_hidden`) and then *rolls the block out* with its head:

- `ArgmaxHead` (DFlash): every slot's draft is the argmax of the target's LM head, all
  slots at once (z-lab ``DFlashDraftModel``; SGLang ``DFLASH``).
- `DominoHead` (``domino.py``, SGLang ``DFLASH`` with ``projector_type: "domino"``): the
  argmax of the base logits plus a GRU correction over the drafted prefix.
- `DSparkHead` (``dspark.py``, SGLang ``DSPARK``): the argmax of the base logits plus a
  Markov bias from the previous drafted token.

Every head has the same seam::

    head.rollout(hidden, anchors, embed_tokens=..., lm_head=..., num_drafts=n) -> [bs, R, n]

``hidden [bs, R, W, H]`` are the drafter's hidden states of ``R`` blocks per batch row
(after its final norm), ``anchors [bs, R]`` each block's slot-0 token. The Domino and
DSpark heads step over the ``n`` slots of a block (their drafts depend on the previous
ones), batched over all ``bs * R`` blocks: baseline and shifted blocks roll out together,
each from its own anchor.

``lm_head`` is the target's output head (``.weight [V, H]``, optional ``.bias``), or a
`DraftVocabHead` of it: then drafts are chosen among its ``K`` tokens only and the
family heads restrict their corrections to the same tokens. ``vocab_size`` crops a
padded head (SGLang's vocab-parallel heads pad their rows) to its first rows.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from .draft_vocab import DraftVocabHead

__all__ = ["ArgmaxHead", "DraftHead", "RolloutHead", "VocabView", "check_rollout_inputs", "chosen_prob", "vocab_view"]


class DraftHead(Protocol):
    """What `multi_anchor.draft_blocks` (and the SGLang worker) call to draft a block."""

    family: str  # "dflash", "domino" or "dspark"

    def rollout(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module, lm_head: nn.Module,
                num_drafts: int, vocab_size: int | None = None) -> Tensor:
        """``hidden [bs, R, W, H]``, ``anchors [bs, R]`` long -> drafts ``[bs, R, num_drafts]`` long
        (full-vocabulary token ids for positions ``anchor + 1 .. anchor + num_drafts``)."""
        ...

    def rollout_with_probs(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module, lm_head: nn.Module,
                           num_drafts: int, vocab_size: int | None = None) -> tuple[Tensor, Tensor]:
        """`rollout`'s drafts and the head's softmax probability of each ``[bs, R, num_drafts]``
        float32, over the scores the draft was chosen from (a family head's corrected logits;
        Domino's candidate pool where it uses one): what `ReAnchorConfig.verify_threshold` cuts by."""
        ...

    def rollout_with_scores(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module, lm_head: nn.Module,
                            num_drafts: int, vocab_size: int | None = None,
                            with_probs: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """`rollout`'s drafts, (``with_probs``) their probabilities, and the scores the first block's
        drafts were the argmax of, ``[bs, num_drafts, V']`` over the LM head's columns (a family head's
        corrected logits along its own rollout; ``-inf`` for tokens a Domino candidate pool leaves out):
        the per-depth distributions branching reads (`sglang_reanchor.branching`)."""
        ...


class VocabView:
    """The vocabulary a rollout scores: rows of the LM head, and their token ids.

    ``weight [V', H]`` and ``bias [V'] | None`` give the base logits; ``token_ids [V']``
    maps a column back to a token id (None: column ``j`` is token ``j``).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, token_ids: Tensor | None) -> None:
        self.weight, self.bias, self.token_ids = weight, bias, token_ids

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def tokens(self, columns: Tensor) -> Tensor:
        """Token ids of logit columns (any shape)."""
        return columns if self.token_ids is None else self.token_ids[columns]

    def rows(self, weight: Tensor, cache: dict) -> Tensor:
        """The rows of a ``[V, D]`` per-token weight for this vocabulary (``weight`` itself
        when it is the full one). A reduced copy is cached in ``cache`` until the weight
        or the token ids change."""
        if self.token_ids is None:
            return weight
        key = (weight.data_ptr(), weight._version, weight.dtype, self.token_ids.data_ptr(),
               self.token_ids.numel())
        if cache.get("key") != key:
            cache["key"], cache["rows"] = key, weight.detach()[self.token_ids.to(weight.device)]
        return cache["rows"]


def vocab_view(lm_head: nn.Module, vocab_size: int | None = None) -> VocabView:
    """`VocabView` of a target LM head or a `DraftVocabHead` (``vocab_size``: crop to the
    first rows of a padded head; not with a `DraftVocabHead`)."""
    weight = lm_head.weight
    bias = getattr(lm_head, "bias", None)
    token_ids = lm_head.token_ids if isinstance(lm_head, DraftVocabHead) else None
    if vocab_size is not None:
        if token_ids is not None:
            raise ValueError("vocab_size crops a padded LM head; a DraftVocabHead already lists its tokens")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= weight.shape[0]:
            raise ValueError(f"vocab_size must be an int in [1, {weight.shape[0]}] (the LM head's rows), "
                             f"got {vocab_size!r}")
        weight = weight[:vocab_size]
        bias = None if bias is None else bias[:vocab_size]
    return VocabView(weight, bias, token_ids)


def check_rollout_inputs(hidden: Tensor, anchors: Tensor, num_drafts: int, max_drafts: int) -> None:
    """Shapes of a rollout call: ``hidden [bs, R, W, H]``, ``anchors [bs, R]`` long,
    ``num_drafts`` an int in ``[1, max_drafts]``."""
    if hidden.dim() != 4:
        raise ValueError(f"hidden must be [bs, R, W, H], got {tuple(hidden.shape)}")
    if anchors.dtype != torch.long or tuple(anchors.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"anchors must be long [bs, R] = {tuple(hidden.shape[:2])}, "
                         f"got {anchors.dtype} {tuple(anchors.shape)}")
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or not 1 <= num_drafts <= max_drafts:
        raise ValueError(f"num_drafts must be an int in [1, {max_drafts}] for blocks of {hidden.shape[2]} slots, "
                         f"got {num_drafts!r}")


def chosen_prob(scores: Tensor) -> Tensor:
    """The softmax probability of each row's argmax, ``[..., V] -> [...]`` float32."""
    x = scores.float()
    return (x.amax(dim=-1) - x.logsumexp(dim=-1)).exp()


class RolloutHead:
    """`DraftHead.rollout`, `DraftHead.rollout_with_probs` and `DraftHead.rollout_with_scores` over a
    head's one ``_rollout``, which computes the probabilities and the first block's scores only when asked."""

    def rollout(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module | None = None,
                lm_head: nn.Module, num_drafts: int, vocab_size: int | None = None) -> Tensor:
        """See `DraftHead.rollout`."""
        return self._rollout(hidden, anchors, embed_tokens, lm_head, num_drafts, vocab_size, False, False)[0]

    def rollout_with_probs(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module | None = None,
                           lm_head: nn.Module, num_drafts: int, vocab_size: int | None = None) -> tuple[Tensor, Tensor]:
        """See `DraftHead.rollout_with_probs`."""
        drafts, probs, _ = self._rollout(hidden, anchors, embed_tokens, lm_head, num_drafts, vocab_size, True, False)
        assert probs is not None
        return drafts, probs

    def rollout_with_scores(self, hidden: Tensor, anchors: Tensor, *, embed_tokens: nn.Module | None = None,
                            lm_head: nn.Module, num_drafts: int, vocab_size: int | None = None,
                            with_probs: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """See `DraftHead.rollout_with_scores`."""
        drafts, probs, scores = self._rollout(hidden, anchors, embed_tokens, lm_head, num_drafts, vocab_size,
                                              with_probs, True)
        assert scores is not None
        return drafts, probs, scores

    def _rollout(self, hidden: Tensor, anchors: Tensor, embed_tokens: nn.Module | None, lm_head: nn.Module,
                 num_drafts: int, vocab_size: int | None, with_probs: bool,
                 with_scores: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        raise NotImplementedError


class ArgmaxHead(RolloutHead):
    """DFlash: slot ``i`` (``1 <= i <= n``) drafts ``argmax(lm_head(hidden[..., i, :]))``
    (``embed_tokens`` is not used: DFlash drafts are independent)."""

    family = "dflash"

    def max_drafts(self, width: int) -> int:
        """Drafts a block of ``width`` query slots yields (slot 0 is the anchor)."""
        return width - 1

    def _rollout(self, hidden: Tensor, anchors: Tensor, embed_tokens: nn.Module | None, lm_head: nn.Module,
                 num_drafts: int, vocab_size: int | None, with_probs: bool,
                 with_scores: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        check_rollout_inputs(hidden, anchors, num_drafts, self.max_drafts(hidden.shape[2]))
        bs, rows, n = anchors.shape[0], anchors.shape[1], num_drafts
        # Logits for slots 0..n, slot 0 dropped after: the same drafts, and on CPU a GEMM
        # with M = B = 16 rows takes a faster path than M = 15 (about 2x here).
        # Rows flattened to 2-D: for some [bs, R, n, H] shapes `linear` takes a batched-matmul
        # path that copies the whole weight (5 ms for 8,192 x 576 here), 2-D is always one GEMM.
        flat = hidden[:, :, : 1 + n].reshape(bs * rows * (1 + n), hidden.shape[-1])
        logits = lm_head(flat)
        if vocab_size is not None:  # a padded head: its rows past the vocabulary are no tokens
            logits = logits[:, :vocab_size]
        drafts = logits.argmax(dim=-1).view(bs, rows, 1 + n)[:, :, 1:]  # [bs, R, n]
        if isinstance(lm_head, DraftVocabHead):  # argmax over a reduced vocabulary: map back
            drafts = lm_head.token_ids[drafts]
        probs = chosen_prob(logits).view(bs, rows, 1 + n)[:, :, 1:] if with_probs else None
        scores = logits.view(bs, rows, 1 + n, -1)[:, 0, 1:] if with_scores else None
        return drafts, probs, scores


ARGMAX_HEAD = ArgmaxHead()
