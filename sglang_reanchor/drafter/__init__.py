"""DFlash drafter: z-lab-compatible model, config, context cache and multi-anchor drafting.

- `DFlashConfig` (``config.py``): the z-lab ``config.json`` format.
- `DFlashDrafter` (``model.py``): the model; loads/saves z-lab checkpoints.
- `ContextKV`, `DraftContextCache` (``context.py``): context keys/values.
- `draft_blocks` (``multi_anchor.py``): R blocks in one forward (ReAnchor).
- `DraftVocabHead` (``draft_vocab.py``): drafts over the target's most frequent tokens only.
"""

from .config import DFlashConfig, build_target_layer_ids
from .context import ContextKV, DraftContextCache
from .draft_vocab import DraftVocabHead, load_draft_vocab, rank_tokens
from .model import DFlashDrafter
from .multi_anchor import draft_blocks, draft_hidden, multi_anchor_mask

__all__ = [
    "ContextKV",
    "DFlashConfig",
    "DFlashDrafter",
    "DraftContextCache",
    "DraftVocabHead",
    "build_target_layer_ids",
    "draft_blocks",
    "draft_hidden",
    "load_draft_vocab",
    "multi_anchor_mask",
    "rank_tokens",
]
