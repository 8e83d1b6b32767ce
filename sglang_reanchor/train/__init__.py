"""DFlash drafter training by self-distillation (``python -m sglang_reanchor.train``).

- `prompts`: offline training prompts and their disjointness from eval sets.
- `selection`: prompt groups (math / stub / other), held-out key sets, pack-only folders.
- `data`: target responses + cached target features (the training set on disk).
- `loss`: anchors, the block attention mask, labels, the weighted loss (full or reduced head).
- `sampler`: the data cursor (group mix, epoch permutations; resumable).
- `trainer`: `Trainer`, `fit` (resumable, validated) and `export` (z-lab folder).
- `acceptance`, `validate`: teacher-forced block acceptance with its standard error.
- `curve`, `learning_curve`: a run's validation curve; tau across drafters against their data.

The CLI (``__main__``) documents the commands that trained the shipped drafter.
"""
