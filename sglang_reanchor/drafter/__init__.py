"""DFlash drafter: z-lab-compatible model, config, context cache and multi-anchor drafting.

- `DFlashConfig` (``config.py``): the z-lab ``config.json`` format.
- `DFlashDrafter` (``model.py``): the model; loads/saves z-lab checkpoints.
- `ContextKV`, `DraftContextCache` (``context.py``): context keys/values.
- `draft_blocks` (``multi_anchor.py``): R blocks in one forward (ReAnchor).
"""

from .config import DFlashConfig, build_target_layer_ids
from .context import ContextKV, DraftContextCache
from .model import DFlashDrafter
from .multi_anchor import draft_blocks, draft_hidden, multi_anchor_mask

__all__ = [
    "ContextKV",
    "DFlashConfig",
    "DFlashDrafter",
    "DraftContextCache",
    "build_target_layer_ids",
    "draft_blocks",
    "draft_hidden",
    "multi_anchor_mask",
]
