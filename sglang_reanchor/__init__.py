"""ReAnchor: pretrained DFlash drafters that reuse the verifier's rejected-suffix states.

Vocabulary (docs/design.md; ReAnchor, Lee et al., Oct 2026; DFlash, z-lab):

- *committed*: tokens whose target KV and features are kept; ``s`` is their count.
- *bonus*: the target's own token at position ``s``, committed but not yet run
  through the target. It is the *root* of the next draft tree and the *anchor*
  of the baseline block.
- *block*: ``[anchor, MASK x (B-1)]``; one drafter forward turns it into ``B-1``
  *drafts*. The *baseline* block is anchored at the bonus; a *shifted* block at
  offset ``d`` is anchored at the target's top-1 prediction ``y[s+d]`` behind the
  previous round's *rejected suffix* and sees that suffix's first ``d`` features.
- *draft tree*: the trie of the baseline chain plus attached shifted blocks.
- *path*: nodes from the root down; *accepted*: the path the target agrees with;
  the next bonus follows its last node (``tau`` = accepted drafts + 1).
- *rejected suffix*: the draft path below the last accepted node (through the
  deepest subtree), whose tokens, target features and target top-1 predictions
  are stored for the next round.

The core (`config`, `tree`, `verify`, `sampling`, `suffix`, `budget`) is pure torch. The
reference engine (`engine`) runs on Hugging Face models; `srt` plugs into SGLang
and is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .budget import BudgetPolicy, SpeculationGate
from .config import ReAnchorConfig
from .sampling import SamplingParams
from .suffix import RejectedSuffix, SuffixStore
from .tree import DraftTree, build_draft_tree
from .verify import Acceptance, accept_tree, verify_tree

__version__ = "0.1.0"

_LAZY = {
    "DFlashDrafter": ".drafter",
    "DFlashConfig": ".drafter",
    "SpeculativeGenerator": ".engine",
    "GenerationResult": ".engine",
}

__all__ = [
    "Acceptance",
    "BudgetPolicy",
    "DFlashConfig",
    "DFlashDrafter",
    "DraftTree",
    "GenerationResult",
    "ReAnchorConfig",
    "RejectedSuffix",
    "SamplingParams",
    "SpeculationGate",
    "SpeculativeGenerator",
    "SuffixStore",
    "accept_tree",
    "build_draft_tree",
    "verify_tree",
]

if TYPE_CHECKING:
    from .drafter import DFlashConfig, DFlashDrafter
    from .engine import GenerationResult, SpeculativeGenerator


def __getattr__(name: str) -> Any:
    # transformers is imported only when the drafter or the engine is used.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
