#!/usr/bin/env bash
# The backlog's code (e618d20 and later) served again: plain SGLang, REANCHOR with nothing set and REANCHOR's chain
# (the entry without its shifted row, disable_by_batch_size 1); 2-core Zen 4, bfloat16, closed-loop clients, 32 greedy
# tokens per request, 32 requests per level, interleaved x3, traced.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-backlog}
CHAIN='{"offsets":[],"node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3,"disable_by_batch_size":1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults chain-batch \
    --batch-node-budget 9 --concurrency 1 2 4 8 16 --requests 32 --chain-config "$CHAIN" --interleave 3 --trace \
    --out $OUT/load_confirm
