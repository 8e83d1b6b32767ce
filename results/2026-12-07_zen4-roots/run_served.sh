#!/usr/bin/env bash
# Served by SGLang on the 2-core Zen 4 (AVX-512 BF16), bfloat16, drafter v8 shipped: plain SGLang; REANCHOR with
# nothing set (this CPU's entry now served with disable_by_batch_size 1: a batch of two or more requests verifies
# its roots alone; measured when the field read "from this many on" and the entry said 2, the same rule); the entry as served before (reanchor-batch: batch_node_budget 9, drafting at every batch
# size); REANCHOR's chain in the new setting (chain-batch: the entry with no shifted row, disable_by_batch_size 1).
# Closed-loop clients, 32 greedy tokens per request (ignore_eos), 32 requests per level, every server up and each
# level measured twice, methods in turn (--interleave 2), nothing else running.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-roots}
ENTRY='{"offsets":[1],"node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3}'
CHAIN='{"offsets":[],"node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3,"disable_by_batch_size":1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults reanchor-batch chain-batch \
    --batch-node-budget 9 --concurrency 1 2 4 8 16 --requests 32 --chain-config "$CHAIN" \
    --reanchor-config "$ENTRY" --interleave 2 --out $OUT/load
