"""Reading a drafter folder: ``config.json`` + safetensors into a `DFlashDrafter` (or a
family subclass), strictly.

`DFlashDrafter.from_pretrained` picks the class from ``config.json``
(`families.drafter_class`) and calls `load_checkpoint`. The class's hooks say how its
checkpoint names map to its parameters (``_checkpoint_tensors``: SGLang accepts a
``model.`` prefix on Domino and DSpark weights and skips a DSpark folder's
``lm_head.*``) and which modules are optional (``_drop_absent_optional``: DSpark's
confidence head). Everything else must match exactly: missing, unexpected or
mis-shaped tensors raise one ``ValueError`` listing them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from torch import Tensor

from .draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab

if TYPE_CHECKING:
    from .model import DFlashDrafter

__all__ = ["load_checkpoint", "read_safetensors"]


def load_checkpoint(cls: type[DFlashDrafter], path: Path, raw: dict[str, Any],
                    device: torch.device | str | None, dtype: torch.dtype | None) -> DFlashDrafter:
    """A ``cls`` drafter with the weights of folder ``path`` (``raw``: its config.json),
    in ``dtype`` (default: the config's), on ``device``, in eval mode."""
    with torch.device("meta"):
        model = cls._from_raw(raw)
    config = model.config
    dtype = dtype or config.torch_dtype
    tensors = model._checkpoint_tensors(read_safetensors(path, device))
    model._drop_absent_optional(set(tensors))
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(f"{k}: {tuple(tensors[k].shape)} != {tuple(expected[k])}"
                   for k in set(expected) & set(tensors) if tensors[k].shape != expected[k])
    if missing or unexpected or wrong:
        raise ValueError(
            f"{path}: checkpoint does not match the {cls.family_name} drafter config.\n"
            f"  missing tensors: {missing}\n  unexpected tensors: {unexpected}\n"
            f"  wrong shapes: {wrong}")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, assign=True)
    model.rotary_emb.inv_freq = model.rotary_emb.compute_inv_freq(model.fc.weight.device)
    if (path / DRAFT_VOCAB_FILE).exists():
        model.vocab_ranking = load_draft_vocab(path)
    return model.eval()


def read_safetensors(path: Path, device: torch.device | str | None) -> dict[str, Tensor]:
    """Every tensor of ``model.safetensors``, or of the shards its index lists."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
    tensors: dict[str, Tensor] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt", device=str(device or "cpu")) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensors[key] = f.get_tensor(key)
    return tensors
