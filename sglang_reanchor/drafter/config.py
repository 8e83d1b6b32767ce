"""DFlash drafter configuration, in the z-lab ``config.json`` format.

The released z-lab drafters (e.g. ``z-lab/Qwen3-4B-DFlash-b16``) ship a Qwen3-style
``config.json`` plus a ``dflash_config`` section::

    {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
     "block_size": 16, "num_target_layers": 36,
     "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
     "hidden_size": 2560, "num_hidden_layers": 5, ..., "rope_theta": 1000000}

`DFlashConfig` reads that dict without ``trust_remote_code`` and writes it back
unchanged: the dict it was read from is kept in ``raw`` and `to_dict` writes each field
into every place it was found (``rope_theta`` or ``rope_parameters.rope_theta``,
top-level ``block_size`` or ``dflash_config.block_size``), so unknown keys survive.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["DFlashConfig", "build_target_layer_ids"]

_LAYER_TYPES = ("full_attention", "sliding_attention")
_DTYPES = ("bfloat16", "float16", "float32", "float64")

# Where each field lives in config.json, canonical place first. Reading takes the first
# present place (dflash_config wins, as in z-lab's `_draft_value`); writing updates
# every present place, or the canonical one when none is present.
_PLACES: dict[str, tuple[tuple[str, ...], ...]] = {
    "mask_token_id": (("dflash_config", "mask_token_id"), ("mask_token_id",)),
    "target_layer_ids": (("dflash_config", "target_layer_ids"), ("target_layer_ids",)),
    "block_size": (("block_size",), ("dflash_config", "block_size")),
    "num_target_layers": (("num_target_layers",), ("dflash_config", "num_target_layers")),
    "rope_theta": (("rope_theta",), ("rope_parameters", "rope_theta")),
    "dtype": (("dtype",), ("torch_dtype",)),
}
_READ_ORDER = {
    name: tuple(sorted(places, key=lambda p: p[0] != "dflash_config"))
    for name, places in _PLACES.items()
}

# Constant keys of the released Qwen3-4B-DFlash-b16 config.json, added when absent.
_TEMPLATE: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "attention_dropout": 0.0,
    "sliding_window": None,
    "use_cache": True,
}


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """Default target layers: evenly spaced from 1 to ``num_target_layers - 3``.

    Same rule as z-lab's ``build_target_layer_ids`` (Python ``round``), so
    ``build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)``. Tiny targets (< 5 layers,
    where z-lab's range would be empty) use layers ``min(1, L-2) .. L-2``: the last layer
    is avoided because HF ``hidden_states[L]`` is after the final norm. Repeated ids
    are dropped, so fewer than ``num_draft_layers`` ids may come back.

    >>> build_target_layer_ids(36, 5)
    (1, 9, 17, 25, 33)
    >>> build_target_layer_ids(4, 2), build_target_layer_ids(1, 3)
    ((1, 2), (0,))
    """
    if num_target_layers < 1 or num_draft_layers < 1:
        raise ValueError(
            f"num_target_layers ({num_target_layers}) and num_draft_layers "
            f"({num_draft_layers}) must be >= 1"
        )
    hi = num_target_layers - 3 if num_target_layers >= 5 else max(0, num_target_layers - 2)
    lo = min(1, hi)
    if num_draft_layers == 1:
        return (min(num_target_layers // 2, hi),)
    span = hi - lo
    ids = [int(round(lo + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]
    return tuple(sorted(set(ids)))


def _get(d: dict[str, Any], place: tuple[str, ...]) -> tuple[bool, Any]:
    for key in place[:-1]:
        d = d.get(key)
        if not isinstance(d, dict):
            return False, None
    return (place[-1] in d), d.get(place[-1])


def _set(d: dict[str, Any], place: tuple[str, ...], value: Any) -> None:
    for key in place[:-1]:
        d = d.setdefault(key, {})
    d[place[-1]] = value


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")  # torch.bfloat16 / "torch.bfloat16" / "bfloat16"


@dataclass(frozen=True)
class DFlashConfig:
    """Hyper-parameters of a DFlash drafter (z-lab ``DFlashDraftModel``).

    Sizes follow HF Qwen3 naming. ``target_layer_ids`` are 0-based target decoder
    layers whose outputs (HF ``hidden_states[l + 1]``) are concatenated into the
    drafter's context features ``[.., K*H]``, ``K = len(target_layer_ids)``.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None = None  # None: unknown (not in the json)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    hidden_act: str = "silu"
    layer_types: tuple[str, ...] | None = None  # None: all "full_attention"
    sliding_window: int | None = None
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    dtype: str = "bfloat16"
    # The json dict this config was read from ({} for a fresh one); see `to_dict`.
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                     "max_position_embeddings"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + masks), got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id must be in [0, vocab_size={self.vocab_size}), "
                f"got {self.mask_token_id}"
            )
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise ValueError(
                f"target_layer_ids must be a non-empty list of ids >= 0, "
                f"got {list(self.target_layer_ids)}"
            )
        if self.num_target_layers is not None and not (
            max(self.target_layer_ids) < self.num_target_layers
        ):
            raise ValueError(
                f"target_layer_ids {list(self.target_layer_ids)} must be in "
                f"[0, num_target_layers - 1 = {self.num_target_layers - 1}]"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' (SwiGLU MLP), got {self.hidden_act!r}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"rms_norm_eps ({self.rms_norm_eps}) and rope_theta ({self.rope_theta}) "
                "must be > 0"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or any(
                t not in _LAYER_TYPES for t in self.layer_types
            ):
                raise ValueError(
                    f"layer_types must list num_hidden_layers={self.num_hidden_layers} "
                    f"values from {_LAYER_TYPES}, got {list(self.layer_types)}"
                )
            if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) > 0:
                raise ValueError(
                    f"sliding_window must be > 0 when layer_types has 'sliding_attention', "
                    f"got {self.sliding_window}"
                )

    # -- derived ------------------------------------------------------------------

    @property
    def num_context_features(self) -> int:
        """Width of the context features, ``K * H`` (the input size of ``fc``)."""
        return len(self.target_layer_ids) * self.hidden_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def layer_type(self, i: int) -> str:
        return "full_attention" if self.layer_types is None else self.layer_types[i]

    # -- json -----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DFlashConfig:
        """Read a z-lab ``config.json`` dict (the dict is copied into ``raw``)."""
        raw = copy.deepcopy(d)

        def read(name: str, default: Any = None) -> Any:
            for place in _READ_ORDER.get(name, ((name,),)):
                found, value = _get(raw, place)
                if found:
                    return value
            return default

        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"rope_parameters.rope_type must be 'default', got {rope_type!r}: "
                "scaled RoPE is not implemented for DFlash drafters"
            )
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "vocab_size") if k not in raw]
        if read("mask_token_id") is None:
            missing.append("dflash_config.mask_token_id")
        if missing:
            raise ValueError(f"DFlash config.json is missing required keys: {missing}")
        num_target_layers = read("num_target_layers")
        layer_ids = read("target_layer_ids")
        if layer_ids is None:
            if num_target_layers is None:
                raise ValueError(
                    "DFlash config.json needs dflash_config.target_layer_ids "
                    "(or num_target_layers to derive them)"
                )
            layer_ids = build_target_layer_ids(num_target_layers, raw["num_hidden_layers"])
        heads = raw["num_attention_heads"]
        return cls(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            block_size=int(read("block_size", 16)),
            mask_token_id=int(read("mask_token_id")),
            target_layer_ids=tuple(layer_ids),
            num_target_layers=num_target_layers,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(read("rope_theta", 10000.0)),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            attention_bias=bool(raw.get("attention_bias", False)),
            hidden_act=raw.get("hidden_act", "silu"),
            layer_types=raw.get("layer_types"),
            sliding_window=raw.get("sliding_window"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            initializer_range=float(raw.get("initializer_range", 0.02)),
            dtype=read("dtype") or "bfloat16",
            raw=raw,
        )

    def to_dict(self) -> dict[str, Any]:
        """The z-lab ``config.json`` dict; ``from_dict(d).to_dict() == d`` for z-lab files."""
        out = copy.deepcopy(self.raw)
        for key, value in _TEMPLATE.items():
            out.setdefault(key, copy.deepcopy(value))
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["target_layer_ids"] = list(self.target_layer_ids)
        if self.layer_types is not None:
            values["layer_types"] = list(self.layer_types)
        for name, value in values.items():
            if name == "raw" or (value is None and name not in out):
                continue  # an optional field absent from the file stays absent
            if name == "rope_theta" and float(value).is_integer():
                value = int(value)  # z-lab files write 1000000, not 1000000.0
            places = _PLACES.get(name, ((name,),))
            present = [p for p in places if _get(out, p)[0]]
            for place in present or places[:1]:
                if _get(out, place)[1] != value:  # equal values keep their json type
                    _set(out, place, value)
        if "rope_parameters" not in out:
            out.setdefault("rope_scaling", None)
        out.setdefault("use_sliding_window", "sliding_attention" in (self.layer_types or ()))
        return out

    # -- construction from a target -------------------------------------------------

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        *,
        num_layers: int,
        block_size: int = 16,
        mask_token_id: int,
        target_layer_ids: list[int] | tuple[int, ...] | None = None,
        intermediate_size: int | None = None,
    ) -> DFlashConfig:
        """A drafter config matching an HF target config (Llama or Qwen3 family).

        Hidden size, heads, head_dim, eps, RoPE theta and vocab come from the target
        (a target's RoPE scaling is not copied: the drafter uses plain RoPE).
        ``target_layer_ids`` defaults to `build_target_layer_ids`.
        """
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        num_target_layers = cfg.num_hidden_layers
        if target_layer_ids is None:
            target_layer_ids = build_target_layer_ids(num_target_layers, num_layers)
        heads = cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
        dtype = getattr(cfg, "dtype", None) or "bfloat16"
        return cls(
            hidden_size=cfg.hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate_size=intermediate_size or cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=tuple(target_layer_ids),
            num_target_layers=num_target_layers,
            rms_norm_eps=float(cfg.rms_norm_eps),
            rope_theta=float(rope_theta),
            max_position_embeddings=cfg.max_position_embeddings,
            attention_bias=bool(getattr(cfg, "attention_bias", False)),
            layer_types=("full_attention",) * num_layers,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            initializer_range=float(getattr(cfg, "initializer_range", 0.02)),
            dtype=_dtype_name(dtype),
        )
