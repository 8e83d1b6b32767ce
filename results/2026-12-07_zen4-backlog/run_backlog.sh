#!/usr/bin/env bash
# The draft-KV backlog served (issue 26): REANCHOR with nothing set before it (EAGER, each root-alone round writes
# its committed rows into the draft KV at once) and with it (BACKLOG, the rows wait until a round drafts), beside
# plain SGLang and REANCHOR's chain (with the backlog); 2-core Zen 4, bfloat16, closed-loop clients, 32 greedy
# tokens per request, 32 requests per level, interleaved x3, every REANCHOR server tracing its rounds.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-backlog}
EAGER=${EAGER:-2af8c54}    # the last commit without the backlog
BACKLOG=${BACKLOG:-HEAD}
CHAIN='{"offsets":[],"node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3,"disable_by_batch_size":1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --tree eager=$EAGER --tree backlog=$BACKLOG \
    --methods plain defaults@eager defaults@backlog chain-batch@backlog --batch-node-budget 9 \
    --concurrency 1 2 4 8 16 --requests 32 --chain-config "$CHAIN" --interleave 3 --trace --out $OUT/load
