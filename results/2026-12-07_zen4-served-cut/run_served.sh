#!/usr/bin/env bash
# Served by SGLang on the 2-core Zen 4 (AVX-512 BF16), drafter v8 shipped, with verify_threshold now served:
# plain SGLang; REANCHOR with nothing set (this CPU's entry: D = {1}, 9 nodes, depth 6, draft_vocab 8192, cut at
# 0.3, trees trimmed to their nodes on a CPU; a batch shares one 9-node tree); DFlash's chain (depth 6,
# draft_vocab 8192) uncut (chain-batch) and cut at 0.1 as the engine's fastest (reanchor-batch with the cut chain
# as its config), both under the same batch budget (--batch-node-budget 9);
# closed-loop clients, 32 greedy tokens per request (ignore_eos), 32 requests per level, every server up and each
# level measured twice, methods in turn (--interleave 2: this host's speed drifts), nothing else running.
# The SGLang venv: bash scripts/install_sglang.sh.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-served-cut}
CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192}'
CUT_CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192,"verify_threshold":0.1}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults chain-batch reanchor-batch \
    --batch-node-budget 9 --concurrency 1 2 4 8 16 --requests 32 --chain-config "$CHAIN" \
    --reanchor-config "$CUT_CHAIN" --interleave 2 --out $OUT/load
