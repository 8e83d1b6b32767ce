#!/usr/bin/env bash
# The top-K bound and best-first trees at every budget, offline over DFlash-chain rounds (`scripts/tree_bound.py`):
# drafter v8 and its Domino head, 10 prompts per dataset, 64 tokens; then the calibration sweep on v8.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
$PY scripts/tree_bound.py --threads 2 --limit 10 --out $OUT/tree_bound_dflash
$PY scripts/tree_bound.py --threads 2 --limit 10 --drafter sglang_reanchor/assets/smollm2-135m-domino-b16 \
    --out $OUT/tree_bound_domino
$PY scripts/tree_bound.py --threads 2 --limit 10 --widths 2 4 --budgets 7 12 16 20 24 32 48 \
    --branch-temperatures 0.5 1.0 1.5 2.5 --out $OUT/tree_bound_dflash_calibration
