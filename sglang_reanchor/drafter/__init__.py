"""DFlash drafter: z-lab-compatible model, config, context cache and multi-anchor drafting.

- `DFlashConfig` (``config.py``): the z-lab ``config.json`` format.
- `DFlashDrafter` (``model.py``): the model; loads/saves z-lab checkpoints.
- `ContextKV`, `DraftContextCache` (``context.py``): context keys/values.
- `draft_blocks` (``multi_anchor.py``): R blocks in one forward (ReAnchor).
- `DraftVocabHead` (``draft_vocab.py``): drafts over the target's most frequent tokens only.
- Drafter families (``families.py``): `DominoDrafter` (``domino.py``, GRU correction head)
  and `DSparkDrafter` (``dspark.py``, Markov head) in SGLang 0.5.23's checkpoint formats;
  `DFlashDrafter.from_pretrained` returns the family the folder holds. Each drafter's
  ``head`` (``heads.py``) rolls a block's hidden states out into drafts.
"""

from .config import DFlashConfig, build_target_layer_ids
from .context import ContextKV, DraftContextCache
from .draft_vocab import DraftVocabHead, load_draft_vocab, rank_tokens
from .domino import DominoDrafter, DominoHead, DominoSettings
from .dspark import DSparkDrafter, DSparkHead, DSparkSettings
from .families import drafter_class, drafter_family
from .heads import ArgmaxHead
from .model import DFlashDrafter
from .multi_anchor import draft_blocks, draft_hidden, multi_anchor_mask

__all__ = [
    "ArgmaxHead",
    "ContextKV",
    "DFlashConfig",
    "DFlashDrafter",
    "DSparkDrafter",
    "DSparkHead",
    "DSparkSettings",
    "DominoDrafter",
    "DominoHead",
    "DominoSettings",
    "DraftContextCache",
    "DraftVocabHead",
    "build_target_layer_ids",
    "draft_blocks",
    "draft_hidden",
    "drafter_class",
    "drafter_family",
    "load_draft_vocab",
    "multi_anchor_mask",
    "rank_tokens",
]
