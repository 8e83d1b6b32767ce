#!/usr/bin/env bash
# One client served by SGLang: plain SGLang, REANCHOR with nothing set (this CPU's entry: one shifted row, 9 nodes,
# cut at 0.3) and REANCHOR with the cut best-first tree alone (no shifted row; top 5, 24 nodes, cut at 0.05),
# both verifying roots alone from two requests on as the entry does; 2-core Zen 4, bfloat16, 32 greedy tokens
# per request, 32 requests, interleaved x3, traced.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-08_zen4-best-first}
TREE='{"offsets":[],"branch_width":4,"branch_rows":32,"branch_length":6,"branch_shape":"best_first","node_budget":24,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.05,"disable_by_batch_size":1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults reanchor \
    --concurrency 1 --requests 32 --reanchor-config "$TREE" --interleave 3 --trace --out $OUT/load_c1
