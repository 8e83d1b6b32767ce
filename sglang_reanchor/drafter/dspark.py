"""DSpark: a DFlash-style block drafter with a Markov head, in SGLang 0.5.23's format.

SGLang serves DSpark as its own algorithm (``DSPARK``, model class ``Qwen3DSparkModel``,
``models/dspark.py``; config parser ``speculative/dspark_components/dspark_config.py``).
A DSpark ``config.json`` is a DFlash one with ``architectures: ["Qwen3DSparkModel"]``
and, at the top level (where SGLang's model reads them):

- ``markov_rank`` ``r > 0`` and ``markov_head_type``: ``vanilla`` | ``gated`` | ``rnn``
  (the parser also finds them in ``dflash_config`` / ``dspark_config``; both places
  must then agree, or SGLang builds one head and loads weights for another);
- ``sample_from_anchor`` (default True): the block is ``gamma = block_size`` query slots
  ``[anchor, MASK x (gamma-1)]`` and slot ``i`` predicts the token at ``anchor + i + 1``;
  False: ``gamma + 1`` slots ``[anchor, MASK x gamma]``, slot ``i`` predicts
  ``anchor + i`` (DFlash's layout). Either way SGLang drafts ``gamma`` tokens;
- ``enable_confidence_head``, ``confidence_head_with_markov`` (default True).

Weights: the DFlash backbone; ``markov_head.markov_w1.weight [V, r]`` (an embedding of the
previous token), ``markov_head.markov_w2.weight [V, r]`` (``Linear(r, V)``); ``gated``
adds ``markov_head.gate_proj.{weight [r, H + r], bias [r]}``, ``rnn``
``markov_head.joint_proj.{weight [3r, 2r + H], bias [3r]}``; optionally
``confidence_head.proj.{weight [1, H + r], bias [1]}``. SGLang skips ``lm_head.*``,
``embed_tokens.*`` and ``rotary_emb.*`` in a DSpark folder (the target's are used).

Greedy rollout (``dspark_draft.py::draft_markov_block``): base logits ``hidden @ lm_head``
of the proposal slots; ``prev`` starts at the anchor; step ``s`` adds the Markov bias
of ``prev`` (vanilla: ``w2(w1[prev])``; gated: ``w2(sigmoid(gate(h_s, w1[prev])) *
w1[prev])``; rnn: a recurrent state updated from ``(state, w1[prev], h_s)``) in float32,
rounds to the step dtype and takes the argmax, which becomes ``prev``.

The confidence head (per-slot acceptance, SGLang's dynamic verify length) is loaded
when the folder has it and exposed as `DSparkHead.confidence`; the engine does not use it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DFlashConfig
from .domino import projector_type
from .heads import RolloutHead, check_rollout_inputs, chosen_prob, vocab_view
from .model import DFlashDrafter

__all__ = ["DSPARK_ARCHITECTURES", "DSparkConfidenceHead", "DSparkDrafter", "DSparkHead", "DSparkSettings",
           "MARKOV_HEAD_TYPES", "MarkovHead"]

DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "LingDSparkModel", "DSparkDraftModel")  # SGLang's EntryClass
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
_BUNDLED_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
_SKIPPED_PREFIXES = ("lm_head.", "rotary_emb.", "embed_tokens.")  # SGLang's DSpark loader skips these


def _nested(raw: dict[str, Any]) -> dict[str, Any]:
    """SGLang's DSpark view of the nested fields: ``dflash_config`` updated by ``dspark_config``."""
    return {**(raw.get("dflash_config") or {}), **(raw.get("dspark_config") or {})}


@dataclass(frozen=True)
class DSparkSettings:
    """The DSpark fields of a draft ``config.json`` (see the module docstring)."""

    markov_rank: int
    markov_head_type: str = "vanilla"
    sample_from_anchor: bool = True
    confidence_head: bool = True  # enable_confidence_head
    confidence_head_with_markov: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.markov_rank, bool) or not isinstance(self.markov_rank, int) or self.markov_rank < 1:
            raise ValueError("DSpark requires markov_rank > 0 (the Markov head is the core of the semi-AR "
                             f"draft); got markov_rank={self.markov_rank!r}.")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"Unsupported DSpark markov_head_type={self.markov_head_type!r}. "
                             f"Supported: {MARKOV_HEAD_TYPES}.")
        for name, field in (("sample_from_anchor", "sample_from_anchor"), ("confidence_head", "enable_confidence_head"),
                            ("confidence_head_with_markov", "confidence_head_with_markov")):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DSpark {field} must be a bool, got {getattr(self, name)!r}.")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DSparkSettings:
        """Parse like SGLang's ``parse_dspark_draft_config`` + ``build_markov_head`` together."""
        bundled = [k for k in _BUNDLED_KEYS if raw.get(k) is not None]
        if bundled:
            raise ValueError(f"DSpark config keys {bundled} belong to a draft bundled in a target checkpoint; "
                             "only standalone DSpark draft folders are supported")
        if projector_type(raw) is not None:
            raise ValueError(f"a DSpark drafter has no projector_type, got {projector_type(raw)!r}")
        nested = _nested(raw)
        parsed_rank = _int(nested.get("markov_rank", raw.get("markov_rank", 0)), "markov_rank")
        if parsed_rank < 0:
            raise ValueError(f"DSpark markov_rank must be >= 0, got {parsed_rank}.")
        if parsed_rank == 0:
            raise ValueError(f"DSpark draft requires markov_rank > 0, got markov_rank={parsed_rank}.")
        model_rank = _int(raw.get("markov_rank", 0), "markov_rank")
        if model_rank <= 0:
            raise ValueError("DSpark requires markov_rank > 0 (the Markov head is the core of the semi-AR draft); "
                             f"got markov_rank={model_rank} at the top level of config.json, where SGLang's "
                             "Qwen3DSparkModel reads it")
        if model_rank != parsed_rank:
            raise ValueError(f"DSpark markov_rank differs between dflash_config/dspark_config ({parsed_rank}) "
                             f"and the top-level config ({model_rank}).")
        parsed_type = nested.get("markov_head_type", raw.get("markov_head_type"))
        if parsed_type is None:
            raise ValueError("DSpark requires markov_head_type when markov_rank > 0, got None.")
        parsed_type = str(parsed_type).lower()
        if parsed_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"Unsupported DSpark markov_head_type={parsed_type!r}. Supported: {MARKOV_HEAD_TYPES}.")
        model_type = str(raw.get("markov_head_type", "vanilla")).lower()
        if model_type != parsed_type:
            raise ValueError(f"DSpark markov_head_type differs between dflash_config/dspark_config ({parsed_type!r}) "
                             f"and the top-level config ({model_type!r}, 'vanilla' when absent), which "
                             "SGLang's model builds")
        return cls(markov_rank=model_rank, markov_head_type=model_type,
                   sample_from_anchor=raw.get("sample_from_anchor", True),
                   confidence_head=raw.get("enable_confidence_head", True),
                   confidence_head_with_markov=raw.get("confidence_head_with_markov", True))

    def write(self, out: dict[str, Any]) -> None:
        """Write the fields at the top level (and where the nested sections already hold them)."""
        archs = out.get("architectures") or []
        if not any(a in DSPARK_ARCHITECTURES for a in archs):
            out["architectures"] = ["Qwen3DSparkModel"]
        out["markov_rank"], out["markov_head_type"] = self.markov_rank, self.markov_head_type
        out["sample_from_anchor"] = self.sample_from_anchor
        out["enable_confidence_head"] = self.confidence_head
        out["confidence_head_with_markov"] = self.confidence_head_with_markov
        for section in ("dflash_config", "dspark_config"):
            nested = out.get(section) or {}
            for name in ("markov_rank", "markov_head_type"):
                if name in nested:
                    nested[name] = getattr(self, name)


def _int(value: Any, field: str) -> int:
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Invalid DSpark {field}={value!r}.") from e


def dspark_mask_token_id(raw: dict[str, Any]) -> Any:
    """The mask token id SGLang's DSpark parser reads (nested sections first, then top level)."""
    return _nested(raw).get("mask_token_id", raw.get("mask_token_id"))


class MarkovHead(nn.Module):
    """The ``vanilla`` Markov head: ``bias = markov_w2(markov_w1[prev])``."""

    def __init__(self, vocab_size: int, markov_rank: int, hidden_size: int) -> None:
        super().__init__()
        self.markov_rank = markov_rank
        self.markov_w1 = nn.Embedding(vocab_size, markov_rank)
        self.markov_w2 = nn.Linear(markov_rank, vocab_size, bias=False)

    def init_state(self, hidden: Tensor) -> Tensor | None:
        """The recurrent state before step 0 (``hidden [rows, n, H]``); None: stateless."""
        return None

    def step(self, prev: Tensor, hidden: Tensor, state: Tensor | None, w2: Tensor) -> tuple[Tensor, Tensor | None]:
        """The bias ``[rows, V']`` of one step (``w2 [V', r]``: the vocabulary's rows of
        ``markov_w2``), from ``prev [rows]`` and the slot's ``hidden [rows, H]``."""
        return F.linear(self.markov_w1(prev), w2), state


class GatedMarkovHead(MarkovHead):
    """``gated``: ``bias = w2(sigmoid(gate_proj(cat(h, w1[prev]))) * w1[prev])``."""

    def __init__(self, vocab_size: int, markov_rank: int, hidden_size: int) -> None:
        super().__init__(vocab_size, markov_rank, hidden_size)
        self.gate_proj = nn.Linear(hidden_size + markov_rank, markov_rank)

    def step(self, prev: Tensor, hidden: Tensor, state: Tensor | None, w2: Tensor) -> tuple[Tensor, Tensor | None]:
        emb = self.markov_w1(prev)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, emb], dim=-1))).to(emb.dtype)
        return F.linear(gate * emb, w2), state


class RNNMarkovHead(MarkovHead):
    """``rnn``: gate / candidate / output from ``joint_proj(cat(state, w1[prev], h))``;
    ``state' = g * state + (1 - g) * tanh(candidate)``, ``bias = w2(tanh(output))``."""

    def __init__(self, vocab_size: int, markov_rank: int, hidden_size: int) -> None:
        super().__init__(vocab_size, markov_rank, hidden_size)
        self.joint_proj = nn.Linear(2 * markov_rank + hidden_size, 3 * markov_rank)

    def init_state(self, hidden: Tensor) -> Tensor | None:
        return torch.zeros(hidden.shape[0], self.markov_rank, device=hidden.device, dtype=hidden.dtype)

    def step(self, prev: Tensor, hidden: Tensor, state: Tensor | None, w2: Tensor) -> tuple[Tensor, Tensor | None]:
        assert state is not None
        z = torch.cat([state, self.markov_w1(prev), hidden], dim=-1)
        gate_raw, candidate_raw, output_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
        return F.linear(torch.tanh(output_raw), w2), state


_MARKOV_CLASSES = {"vanilla": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNMarkovHead}


class DSparkConfidenceHead(nn.Module):
    """``proj``: ``Linear(H (+ r), 1)`` over the slot's hidden state (and ``w1[prev]``)."""

    def __init__(self, hidden_size: int, markov_rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (markov_rank if with_markov else 0), 1)


class DSparkHead(RolloutHead):
    """DSpark's greedy Markov rollout of a block (see the module docstring)."""

    family = "dspark"

    def __init__(self, markov_head: MarkovHead, confidence_head: DSparkConfidenceHead | None,
                 sample_from_anchor: bool) -> None:
        self.markov_head, self.confidence_head = markov_head, confidence_head
        self.sample_from_anchor = sample_from_anchor
        self._rows_cache: dict = {}

    @classmethod
    def over(cls, markov_head: nn.Module, confidence_head: nn.Module | None,
             sample_from_anchor: bool) -> DSparkHead:
        """A head over another implementation's modules with DSpark's parameter names, such
        as SGLang's loaded ``Qwen3DSparkModel.markov_head`` / ``.confidence_head``: the
        parameters are shared, not copied (the kind is read from ``gate_proj`` / ``joint_proj``)."""
        vocab, rank = markov_head.markov_w1.weight.shape
        if hasattr(markov_head, "joint_proj"):
            kind, hidden = "rnn", markov_head.joint_proj.weight.shape[1] - 2 * rank
        elif hasattr(markov_head, "gate_proj"):
            kind, hidden = "gated", markov_head.gate_proj.weight.shape[1] - rank
        else:
            kind, hidden = "vanilla", 0
        with torch.device("meta"):
            ours = _MARKOV_CLASSES[kind](vocab, rank, hidden)
        ours.load_state_dict(markov_head.state_dict(keep_vars=True), assign=True)
        return cls(ours, confidence_head, sample_from_anchor)

    def max_drafts(self, width: int) -> int:
        """Drafts a block of ``width`` slots yields: ``width`` when sampling from the anchor."""
        return width if self.sample_from_anchor else width - 1

    def _slots(self, hidden: Tensor, n: int) -> Tensor:
        """The proposal slots' hidden states ``[bs * R, n, H]``."""
        start = 0 if self.sample_from_anchor else 1
        bs, num_blocks, _, h = hidden.shape
        return hidden[:, :, start:start + n].reshape(bs * num_blocks, n, h)

    def _rollout(self, hidden: Tensor, anchors: Tensor, embed_tokens: nn.Module | None, lm_head: nn.Module,
                 num_drafts: int, vocab_size: int | None, with_probs: bool,
                 with_scores: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Drafts ``[bs, R, n]`` of blocks ``hidden [bs, R, W, H]`` with slot-0 tokens ``anchors [bs, R]``,
        (``with_probs``) their probabilities under the base logits plus the Markov bias, and
        (``with_scores``) those scores of the first block, ``[bs, n, V']``
        (``embed_tokens`` is not used: the Markov head embeds the previous token itself)."""
        check_rollout_inputs(hidden, anchors, num_drafts, self.max_drafts(hidden.shape[2]))
        bs, num_blocks, n = anchors.shape[0], anchors.shape[1], num_drafts
        rows = bs * num_blocks
        view = vocab_view(lm_head, vocab_size)
        w2 = view.rows(self.markov_head.markov_w2.weight, self._rows_cache)  # [V', r]
        if view.token_ids is None and view.size != w2.shape[0]:
            raise ValueError(f"the LM head scores {view.size} tokens, the Markov head's markov_w2 {w2.shape[0]} "
                             "(vocab_size); pass vocab_size= to crop a padded head")
        slots = self._slots(hidden, n)  # [rows, n, H]
        flat = slots.reshape(rows * n, slots.shape[-1])
        base = torch.matmul(flat.to(view.weight.dtype), view.weight.T)
        if view.bias is not None:
            base = base + view.bias
        base = base.view(rows, n, view.size)
        step_dtype = torch.promote_types(base.dtype, self.markov_head.markov_w1.weight.dtype)
        acc = torch.promote_types(step_dtype, torch.float32)  # SGLang adds in float32, then rounds
        state = self.markov_head.init_state(slots)
        prev = anchors.reshape(rows)
        drafts, probs, scores = [], [], []
        for s in range(n):
            bias, state = self.markov_head.step(prev, slots[:, s], state, w2)
            value = (base[:, s].to(acc) + bias.to(acc)).to(step_dtype)
            prev = view.tokens(value.argmax(dim=-1))
            drafts.append(prev)
            if with_probs:
                probs.append(chosen_prob(value))
            if with_scores:
                scores.append(value[::num_blocks])  # each batch row's first block
        out = torch.stack(drafts, dim=1).view(bs, num_blocks, n)
        return (out, torch.stack(probs, dim=1).view(bs, num_blocks, n) if with_probs else None,
                torch.stack(scores, dim=1) if with_scores else None)

    def confidence(self, hidden: Tensor, anchors: Tensor, drafts: Tensor) -> Tensor:
        """SGLang's ``DSparkConfidenceHead.predict`` (no calibration): per-draft acceptance
        estimates ``[bs, R, n]`` float32 in ``[0, 1]`` for ``drafts [bs, R, n]`` rolled out from
        ``hidden [bs, R, W, H]`` and ``anchors [bs, R]``. Raises if the drafter has none."""
        if self.confidence_head is None:
            raise ValueError("this DSpark drafter has no confidence head (its folder carries no "
                             "confidence_head.* tensors, or enable_confidence_head is false)")
        bs, num_blocks, n = drafts.shape
        prev = torch.cat([anchors[..., None], drafts[..., : n - 1]], dim=-1).reshape(bs * num_blocks, n)
        features = self.confidence_features(self._slots(hidden, n), prev)
        proj = self.confidence_head.proj
        raw = proj(features.to(proj.weight.dtype)).squeeze(-1)
        return torch.sigmoid(raw.float()).view(bs, num_blocks, n)

    def confidence_features(self, slots: Tensor, prev: Tensor) -> Tensor:
        """What the confidence head reads at each proposal slot: ``slots [R, n, H]`` (their hidden
        states) and ``prev [R, n]`` long (the token before each: the anchor, then the drafts) ->
        ``[R, n, H]``, or ``[R, n, H + r]`` with ``cat(h, markov_w1[prev])`` when the head reads the
        Markov embedding too (``confidence_head_with_markov``)."""
        if self.confidence_head is None or not self.confidence_head.with_markov:
            return slots
        return torch.cat([slots, self.markov_head.markov_w1(prev).to(slots.dtype)], dim=-1)


class DSparkDrafter(DFlashDrafter):
    """A DSpark drafter: DFlash backbone + Markov head (``self.head``: `DSparkHead`).

    ``block_size`` is the query slots of a block: ``gamma`` (the config's
    ``block_size``) when sampling from the anchor, else ``gamma + 1``.
    """

    family = "dspark"
    family_name = "DSpark"

    def __init__(self, config: DFlashConfig, dspark: DSparkSettings) -> None:
        super().__init__(config)
        self.dspark = dspark
        h, r, v = config.hidden_size, dspark.markov_rank, config.vocab_size
        self.markov_head = _MARKOV_CLASSES[dspark.markov_head_type](v, r, h)
        self.confidence_head = (DSparkConfidenceHead(h, r, dspark.confidence_head_with_markov)
                                if dspark.confidence_head else None)
        self.reset_parameters()
        self.head = DSparkHead(self.markov_head, self.confidence_head, dspark.sample_from_anchor)

    def reset_parameters(self) -> None:
        super().reset_parameters()  # every Linear ~ N(0, initializer_range)
        markov = getattr(self, "markov_head", None)
        if markov is not None:
            nn.init.normal_(markov.markov_w1.weight, std=self.config.initializer_range)

    @property
    def block_size(self) -> int:
        return self.config.block_size + (0 if self.dspark.sample_from_anchor else 1)

    @property
    def gamma(self) -> int:
        """Drafts per block in SGLang's DSPARK (the config's ``block_size``)."""
        return self.config.block_size

    @classmethod
    def _from_raw(cls, raw: dict[str, Any]) -> DSparkDrafter:
        dspark = DSparkSettings.from_dict(raw)
        mask = dspark_mask_token_id(raw)
        if mask is not None and (raw.get("dflash_config") or {}).get("mask_token_id", raw.get("mask_token_id")) != mask:
            raw = copy.deepcopy(raw)  # the id SGLang's DSpark parser reads, where DFlashConfig reads it
            raw.setdefault("dflash_config", {})["mask_token_id"] = mask
        return cls(DFlashConfig.from_dict(raw), dspark)

    def config_dict(self) -> dict[str, Any]:
        out = super().config_dict()
        self.dspark.write(out)
        return out

    def _checkpoint_tensors(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        named = {k.removeprefix("model."): v for k, v in tensors.items()}
        skip = _SKIPPED_PREFIXES + (() if self.dspark.confidence_head else ("confidence_head.",))
        return {k: v for k, v in named.items() if not k.startswith(skip)}

    def _drop_absent_optional(self, names: set[str]) -> None:
        if self.confidence_head is not None and not any(k.startswith("confidence_head.") for k in names):
            self.confidence_head = None  # SGLang's default (static verify) does not build one either
            self.head.confidence_head = None

    def validate_target(self, target_config: Any, *, strict: bool = False) -> None:
        super().validate_target(target_config, strict=strict)
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        if cfg.vocab_size != self.config.vocab_size:
            raise ValueError(f"vocab_size: the Markov head biases {self.config.vocab_size} tokens "
                             f"(markov_w2), the target has {cfg.vocab_size}; they must be equal")
