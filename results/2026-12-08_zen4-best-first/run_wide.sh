#!/usr/bin/env bash
# Best-first trees over each slot's top 5 (branch_width 4), the width the top-K bound says holds more
# (tree_bound_*), at 24 and 64 nodes, on drafter v8 and its Domino head; the DFlash chain and plain decoding
# beside them. T = 0, every method interleaved per sample, one process on both cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A=sglang_reanchor/assets
BF="offsets=,branch_width=4,branch_rows=32,branch_length=6,branch_shape=best_first,max_depth=6,draft_vocab=8192"
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64 --threads 2 --no-trace \
    --extra-drafter dm=$A/smollm2-135m-domino-b16 --limit ${LIMIT:-6} --methods \
    target "dflash:max_depth=6,draft_vocab=8192" "reanchor:$BF,node_budget=24" \
    "reanchor:$BF,node_budget=24,drafter=dm" "reanchor:$BF,node_budget=64,drafter=dm" \
    --out $OUT/bench_wide
