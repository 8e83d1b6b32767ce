"""Domino: a DFlash drafter with a GRU correction head, in SGLang 0.5.23's format.

SGLang serves Domino through ``DFLASH``: its draft ``config.json`` is a DFlash one whose
``dflash_config`` (or top level) says ``projector_type: "domino"`` plus

- ``shift_label`` (bool): slot ``i`` predicts the token at ``anchor + i + 1`` (slots
  ``0 .. W-2`` are read) instead of ``anchor + i`` (slots ``1 .. W-1``, DFlash's layout);
- ``pure_draft_prefix_len``: must be 1 (the first proposal is the backbone's alone);
- ``gru_hidden_dim`` ``G`` and ``emb_dim`` ``E`` (``emb_dim`` may sit in both places;
  then they must agree).

Weights: the DFlash backbone plus ``prefix_gru`` (``nn.GRU(H, G)``, one layer, no
bias: ``prefix_gru.weight_ih_l0 [3G, H]``, ``prefix_gru.weight_hh_l0 [3G, G]``) and
``embed_proj`` = ``Linear(H + G, E) -> SiLU -> Linear(E, V)``, no biases
(``embed_proj.0.weight [E, H + G]``, ``embed_proj.2.weight [V, E]``). Read from
SGLang's ``speculative/dflash_utils.py::parse_dflash_draft_config`` and
``models/dflash.py::DFlashDraftModel``; the errors below name the same fields.

Rollout (SGLang ``speculative/domino_utils.py::domino_greedy_rollout``, default
``--speculative-domino-candidate-pool-size 2048``): a block of ``W`` slots has ``P = W-1``
proposal slots ``z``; base logits ``z @ lm_head``; proposal 1 is their argmax; the GRU
reads the target embeddings of ``[anchor, proposal 1]``; proposal ``i > 1`` is the argmax
of base logits + ``embed_proj(cat(z_i, gru_state))``, after which the GRU steps on it.
When ``0 < pool < V``, the correction only scores one candidate pool per block: the
``pool`` tokens with the highest base logit over proposal slots ``2 .. P``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DFlashConfig
from .heads import RolloutHead, check_rollout_inputs, chosen_prob, vocab_view
from .model import DFlashDrafter

__all__ = ["DEFAULT_CANDIDATE_POOL_SIZE", "DominoDrafter", "DominoHead", "DominoSettings"]

DEFAULT_CANDIDATE_POOL_SIZE = 2048  # SGLang's --speculative-domino-candidate-pool-size default


def _optional_int(value: Any, field: str, min_value: int) -> int | None:
    """SGLang's ``_parse_optional_int``: None stays None, else ``int(value) >= min_value``."""
    if value is None:
        return None
    try:
        parsed = int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Invalid {field}={value!r}.") from e
    if parsed < min_value:
        word = "positive" if min_value == 1 else f">= {min_value}"
        raise ValueError(f"{field} must be {word}, got {parsed}.")
    return parsed


def projector_type(raw: dict[str, Any]) -> Any:
    """``dflash_config.projector_type``, else the top-level one (None: plain DFlash)."""
    nested = raw.get("dflash_config") or {}
    return nested.get("projector_type", raw.get("projector_type"))


@dataclass(frozen=True)
class DominoSettings:
    """The Domino fields of a draft ``config.json`` (see the module docstring)."""

    shift_label: bool
    gru_hidden_dim: int
    emb_dim: int
    pure_draft_prefix_len: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.shift_label, bool):
            raise ValueError(f"DFLASH Domino requires dflash_config.shift_label to be a bool, got {self.shift_label!r}.")
        if self.pure_draft_prefix_len != 1:
            raise ValueError("DFLASH Domino currently requires pure_draft_prefix_len=1, "
                             f"got {self.pure_draft_prefix_len!r}.")
        for name in ("gru_hidden_dim", "emb_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DFLASH Domino {name} must be positive, got {value!r}.")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DominoSettings:
        """Parse like SGLang's ``parse_dflash_draft_config`` (same checks, same order)."""
        nested = raw.get("dflash_config") or {}
        if projector_type(raw) != "domino":
            raise ValueError(f"not a Domino config: projector_type={projector_type(raw)!r}")
        shift_label = nested.get("shift_label", raw.get("shift_label"))
        prefix_len = _optional_int(nested.get("pure_draft_prefix_len", raw.get("pure_draft_prefix_len")),
                                   "DFLASH Domino pure_draft_prefix_len", 0)
        gru = _optional_int(nested.get("gru_hidden_dim", raw.get("gru_hidden_dim")),
                            "DFLASH Domino gru_hidden_dim", 1)
        nested_emb = _optional_int(nested.get("emb_dim"), "DFLASH Domino dflash_config.emb_dim", 1)
        top_emb = _optional_int(raw.get("emb_dim"), "DFLASH Domino top-level emb_dim", 1)
        if nested_emb is not None and top_emb is not None and nested_emb != top_emb:
            raise ValueError("DFLASH Domino emb_dim differs between dflash_config and the top-level config: "
                             f"{nested_emb} != {top_emb}.")
        emb = nested_emb if nested_emb is not None else top_emb
        if not isinstance(shift_label, bool):
            raise ValueError(f"DFLASH Domino requires dflash_config.shift_label to be a bool, got {shift_label!r}.")
        if prefix_len != 1:
            raise ValueError(f"DFLASH Domino currently requires pure_draft_prefix_len=1, got {prefix_len!r}.")
        if gru is None:
            raise ValueError("DFLASH Domino requires dflash_config.gru_hidden_dim.")
        if emb is None:
            raise ValueError("DFLASH Domino requires dflash_config.emb_dim.")
        return cls(shift_label=shift_label, gru_hidden_dim=gru, emb_dim=emb, pure_draft_prefix_len=prefix_len)

    def write(self, out: dict[str, Any]) -> None:
        """Write the fields into a config dict: where they already are, else ``dflash_config``."""
        nested = out.setdefault("dflash_config", {})
        for name, value in (("projector_type", "domino"), ("shift_label", self.shift_label),
                            ("pure_draft_prefix_len", self.pure_draft_prefix_len),
                            ("gru_hidden_dim", self.gru_hidden_dim), ("emb_dim", self.emb_dim)):
            for place in [p for p in (nested, out) if name in p] or [nested]:
                place[name] = value


class DominoHead(RolloutHead):
    """Domino's greedy rollout of a block (see the module docstring).

    Holds the drafter's ``prefix_gru`` and ``embed_proj`` (references, not copies).
    ``candidate_pool_size``: SGLang's ``--speculative-domino-candidate-pool-size``
    (0 scores the whole vocabulary).
    """

    family = "domino"

    def __init__(self, prefix_gru: nn.GRU, embed_proj: nn.Sequential, shift_label: bool,
                 candidate_pool_size: int = DEFAULT_CANDIDATE_POOL_SIZE) -> None:
        self.prefix_gru, self.embed_proj, self.shift_label = prefix_gru, embed_proj, shift_label
        self.candidate_pool_size = candidate_pool_size
        self._rows_cache: dict = {}

    @property
    def candidate_pool_size(self) -> int:
        return self._pool

    @candidate_pool_size.setter
    def candidate_pool_size(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"Domino candidate_pool_size must be a non-negative int, got {value!r}.")
        self._pool = value

    def max_drafts(self, width: int) -> int:
        return width - 1

    def _rollout(self, hidden: Tensor, anchors: Tensor, embed_tokens: nn.Module | None, lm_head: nn.Module,
                 num_drafts: int, vocab_size: int | None, with_probs: bool,
                 with_scores: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Drafts ``[bs, R, n]`` of blocks ``hidden [bs, R, W, H]`` with slot-0 tokens ``anchors [bs, R]``:
        the first ``n`` of the ``W - 1`` proposals (the candidate pool is the whole block's, so they do
        not depend on ``n``); with ``with_probs`` each draft's probability, the first over the base
        logits, a later one over the corrected scores (of the pool where one is used); with
        ``with_scores`` the first block's scores ``[bs, n, V']`` (``-inf`` outside the pool)."""
        if embed_tokens is None:
            raise ValueError("a Domino rollout needs embed_tokens (the target's input embedding): its GRU "
                             "reads the anchor and the drafts")
        width = hidden.shape[2]
        check_rollout_inputs(hidden, anchors, num_drafts, self.max_drafts(width))
        bs, num_blocks, _, h = hidden.shape
        rows, n, proposals = bs * num_blocks, num_drafts, width - 1
        view = vocab_view(lm_head, vocab_size)
        out_proj = self.embed_proj[2].weight  # [V, E]
        if view.token_ids is None and view.size != out_proj.shape[0]:
            raise ValueError(f"the LM head scores {view.size} tokens, the Domino head's embed_proj.2 "
                             f"{out_proj.shape[0]} (vocab_size); pass vocab_size= to crop a padded head")
        start = 0 if self.shift_label else 1
        z = hidden[:, :, start:start + proposals].reshape(rows, proposals, h)  # [rows, P, H]
        pool = min(self.candidate_pool_size, view.size)
        use_pool = 0 < pool < view.size and n > 1
        steps = proposals if use_pool else n  # the pool needs every proposal slot's base logits
        z_in = z[:, :steps].to(view.weight.dtype).transpose(0, 1).reshape(steps * rows, h)  # step-major
        base = F.linear(z_in, view.weight, view.bias).view(steps, rows, view.size)  # [steps, rows, V']
        col = base[0].argmax(dim=-1)
        token = view.tokens(col)
        drafts, probs = [token], [chosen_prob(base[0])] if with_probs else []
        first = slice(None, None, num_blocks)  # the rows of each batch row's first block
        scores = [base[0, first]] if with_scores else []

        def stacked() -> tuple[Tensor, Tensor | None, Tensor | None]:
            out = torch.stack(drafts, dim=1).view(bs, num_blocks, n)
            return (out, torch.stack(probs, dim=1).view(bs, num_blocks, n) if with_probs else None,
                    torch.stack([x.float() for x in scores], dim=1) if with_scores else None)

        if n == 1:
            return stacked()
        out_w = view.rows(out_proj, self._rows_cache)  # [V', E]
        if use_pool:
            feedback = base[1:]  # [P-1, rows, V']
            cand = torch.topk(feedback.amax(dim=0), k=pool, dim=-1, sorted=False).indices  # [rows, pool]
            cand_base = torch.gather(feedback.transpose(0, 1), 2,
                                     cand[:, None, :].expand(-1, proposals - 1, -1)).transpose(0, 1)
            cand_w = F.embedding(cand, out_w)  # [rows, pool, E]
        gru_w = self.prefix_gru.weight_ih_l0
        prefix = torch.stack((anchors.reshape(rows), token), dim=1)  # [rows, 2]
        _, state = self.prefix_gru(embed_tokens(prefix).to(gru_w.dtype))  # [1, rows, G]
        for i in range(1, n):
            latent = self.embed_proj[1](self.embed_proj[0](torch.cat((z[:, i], state[0]), dim=-1)))  # [rows, E]
            if use_pool:
                step = cand_base[i - 1] + torch.bmm(cand_w, latent.unsqueeze(-1)).squeeze(-1)  # [rows, pool]
                col = torch.gather(cand, 1, step.argmax(dim=-1)[:, None]).squeeze(1)
            else:
                step = base[i] + F.linear(latent, out_w)  # [rows, V']
                col = step.argmax(dim=-1)
            token = view.tokens(col)
            drafts.append(token)
            if with_probs:
                probs.append(chosen_prob(step))
            if with_scores:
                scores.append(step[first] if not use_pool else
                              step.new_full((bs, view.size), -torch.inf).scatter(1, cand[first], step[first]))
            if i + 1 < n:  # the GRU reads this proposal before the next one
                state = torch.gru_cell(embed_tokens(token).to(gru_w.dtype), state[0], gru_w,
                                       self.prefix_gru.weight_hh_l0, None, None)[None]
        return stacked()


class DominoDrafter(DFlashDrafter):
    """A DFlash drafter with Domino's GRU correction head (``self.head``: `DominoHead`)."""

    family = "domino"
    family_name = "Domino"

    def __init__(self, config: DFlashConfig, domino: DominoSettings) -> None:
        super().__init__(config)
        self.domino = domino
        h, g = config.hidden_size, domino.gru_hidden_dim
        self.prefix_gru = nn.GRU(input_size=h, hidden_size=g, num_layers=1, batch_first=True, bias=False)
        self.embed_proj = nn.Sequential(nn.Linear(h + g, domino.emb_dim, bias=False), nn.SiLU(),
                                        nn.Linear(domino.emb_dim, config.vocab_size, bias=False))
        self.reset_parameters()
        self.head = DominoHead(self.prefix_gru, self.embed_proj, domino.shift_label)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        gru = getattr(self, "prefix_gru", None)
        if gru is not None:
            gru.reset_parameters()  # torch's U(-1/sqrt(G), 1/sqrt(G))

    @classmethod
    def _from_raw(cls, raw: dict[str, Any]) -> DominoDrafter:
        return cls(DFlashConfig.from_dict(raw), DominoSettings.from_dict(raw))

    def config_dict(self) -> dict[str, Any]:
        out = super().config_dict()
        self.domino.write(out)
        return out

    def _checkpoint_tensors(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k.removeprefix("model."): v for k, v in tensors.items()}  # SGLang reads both

    def validate_target(self, target_config: Any, *, strict: bool = False) -> None:
        super().validate_target(target_config, strict=strict)
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        if cfg.vocab_size != self.config.vocab_size:
            raise ValueError(f"vocab_size: the Domino head scores {self.config.vocab_size} tokens "
                             f"(embed_proj.2), the target has {cfg.vocab_size}; they must be equal")
