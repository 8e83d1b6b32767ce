#!/usr/bin/env bash
# This CPU's shipped default (one shifted row, 9 nodes, cut at 0.3) against the cut best-first tree (top 5,
# 24 nodes, cut at 0.05) alone and below one shifted row, the DFlash chain, uncut and cut at 0.1, and plain
# decoding. T = 0, every method interleaved per sample, one process on both cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
D6="max_depth=6,draft_vocab=8192"
BF="branch_width=4,branch_rows=32,branch_length=6,branch_shape=best_first,$D6,node_budget=24,verify_threshold=0.05"
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64 --threads 2 --no-trace \
    --limit ${LIMIT:-6} --skip ${SKIP:-6} --methods \
    target "dflash:$D6" "dflash:$D6,verify_threshold=0.1" "reanchor:policy=offset,offsets=1,$D6,node_budget=9,verify_threshold=0.3" \
    "reanchor:offsets=,$BF" "reanchor:policy=offset,offsets=1,$BF" \
    --out $OUT/bench_default
