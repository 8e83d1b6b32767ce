#!/usr/bin/env bash
# Served by SGLang on the 2-core Zen 4 (AVX-512 BF16) with drafter v8 shipped: plain SGLang, REANCHOR with nothing
# set (this CPU's entry of device_defaults.json: D = {1}, 9 nodes, depth 6; SGLang verifies it uncut, and with no
# served fields measured here a batch shares one 9-node tree) and DFlash's chain (depth 6, draft_vocab 8192) under
# the same batch budget (chain-batch, --batch-node-budget 9);
# closed-loop clients, 32 greedy tokens per request (ignore_eos), 32 requests per level, every server up and each
# level measured twice, methods in turn (--interleave 2: this host's speed drifts), nothing else running.
# The SGLang venv: bash scripts/install_sglang.sh.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-v8}
CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192}'
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults chain-batch --batch-node-budget 9 \
    --concurrency 1 2 4 8 16 --requests 32 --chain-config "$CHAIN" --interleave 2 --out $OUT/load_v8
