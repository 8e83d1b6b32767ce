#!/usr/bin/env bash
# Best-first trees over each slot's top 5, 24 nodes, cut where the drafter's chance of a node falls below
# verify_threshold (only nodes worth at least that are verified), against the chains, cut and uncut, on drafter
# v8 and its Domino head. T = 0, every method interleaved per sample, one process on both cores, nothing else.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A=sglang_reanchor/assets
D6="max_depth=6,draft_vocab=8192"
BF="offsets=,branch_width=4,branch_rows=32,branch_length=6,branch_shape=best_first,$D6,node_budget=24"
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64 --threads 2 --no-trace \
    --extra-drafter dm=$A/smollm2-135m-domino-b16 --limit ${LIMIT:-6} --methods \
    target "dflash:$D6" "dflash:$D6,verify_threshold=0.1" "dflash:$D6,drafter=dm" \
    "dflash:$D6,verify_threshold=0.1,drafter=dm" "reanchor:$BF,verify_threshold=0.05" \
    "reanchor:$BF,verify_threshold=0.05,drafter=dm" "reanchor:$BF,verify_threshold=0.02,drafter=dm" \
    --out $OUT/bench_cut
