"""DFlash drafter training by self-distillation (``python -m sglang_reanchor.train``).

- `prompts`: offline training prompts and their disjointness from eval sets.
- `data`: target responses + cached target features (the training set on disk).
- `loss`: anchors, the block attention mask, labels, the weighted loss.
- `trainer`: `Trainer`, `fit` (resumable, validated) and `export` (z-lab folder).

The CLI (``__main__``) documents the commands that trained the shipped drafter.
"""
