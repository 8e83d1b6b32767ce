#!/usr/bin/env bash
# The exact commands behind results/v5/ (2026-12-01, same machine and settings as results/v4:
# bfloat16 via dtype=auto, one process, 2 torch threads, nothing else running). Drafter: the
# shipped v5 folder. Steps 0-4 are results/v4/run_all.sh with OUT=results/v5 (step 0 ran with
# CANDIDATES=/work/train_work/run5/drafter, the v4 fine-tune continued on the 8,960-response pool).
set -euo pipefail
PY=${PY:-python}
OUT=results/v5 bash results/v4/run_all.sh

# 5. The offset policy on development prompts (after the ablation of step 4 showed its gain).
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 2 \
    --max-new-tokens 48 --threads 2 --no-trace --methods target dflash reanchor "reanchor:policy=offset" \
    "dflash:draft_vocab=8192" "reanchor:policy=offset,draft_vocab=8192" --out results/v5/dev_policy
