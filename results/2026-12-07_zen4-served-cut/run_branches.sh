#!/usr/bin/env bash
# After run_served.sh: the eighth CPU candidate served, now that the cut is: one shifted row plus four 3-token
# branches of the drafter's runner-ups, 16 nodes, depth 6, draft_vocab 8192, cut at 0.1 (engine, this CPU: tau
# 1.13x the chain's at 1.31x plain), beside this CPU's entry (defaults: D = {1}, 9 nodes, cut 0.3) and plain
# SGLang; each with batch_node_budget its own tree size (16 / 9); the same load as run_served.sh.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-served-cut}
BRANCHES='{"offsets":[1],"policy":"offset","node_budget":16,"max_depth":6,"draft_vocab":8192,"branch_width":2,"branch_rows":4,"branch_length":3,"verify_threshold":0.1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults reanchor-batch \
    --batch-node-budget 16 --concurrency 1 2 4 8 16 --requests 32 --reanchor-config "$BRANCHES" \
    --interleave 2 --out $OUT/load_branches
