"""Which DFlash-family drafter a ``config.json`` describes, and the class that loads it.

============  =====================================================  ===================
family        how SGLang 0.5.23 recognises it                        class
============  =====================================================  ===================
``dflash``    a DFlash config (z-lab ``DFlashDraftModel``)            `DFlashDrafter`
``domino``    ``dflash_config.projector_type == "domino"``            `DominoDrafter`
``dspark``    ``architectures`` names a DSpark model                 `DSparkDrafter`
              (``Qwen3DSparkModel``, ``LingDSparkModel``, ...)
============  =====================================================  ===================

Anything else that names a head (another ``projector_type``, Markov fields on a
non-DSpark architecture) is refused here with the field named, rather than loaded as
a plain DFlash drafter that would silently ignore the head.
"""

from __future__ import annotations

from typing import Any

from .domino import DominoDrafter, projector_type
from .dspark import DSPARK_ARCHITECTURES, DSparkDrafter
from .model import DFlashDrafter

__all__ = ["FAMILIES", "drafter_class", "drafter_family"]

FAMILIES: dict[str, type[DFlashDrafter]] = {"dflash": DFlashDrafter, "domino": DominoDrafter,
                                            "dspark": DSparkDrafter}


def drafter_family(raw: dict[str, Any]) -> str:
    """``"dflash"``, ``"domino"`` or ``"dspark"`` for a draft ``config.json`` dict."""
    archs = raw.get("architectures") or []
    if any(a in DSPARK_ARCHITECTURES for a in archs):
        return "dspark"
    kind = projector_type(raw)
    if kind == "domino":
        return "domino"
    if kind is not None:
        raise ValueError(f"dflash_config.projector_type must be absent (DFlash) or 'domino', got {kind!r}")
    if raw.get("markov_rank") or (raw.get("dflash_config") or {}).get("markov_rank"):
        raise ValueError(f"config.json has markov_rank but architectures {archs} names no DSpark model; "
                         f"a DSpark drafter says one of {list(DSPARK_ARCHITECTURES)}")
    return "dflash"


def drafter_class(raw: dict[str, Any]) -> type[DFlashDrafter]:
    """The `DFlashDrafter` subclass for a draft ``config.json`` dict."""
    return FAMILIES[drafter_family(raw)]
