#!/usr/bin/env bash
# Served by SGLang on the 2-core AMX Xeon with drafter v8 shipped: plain SGLang, REANCHOR with nothing set
# (what the plugin serves here: the AMX entry of device_defaults.json, with its shipped cost profile) and DFlash's
# chain under the same cost-profile budget; closed-loop clients, 32 greedy tokens per request (ignore_eos), 32
# requests per level, one server at a time, nothing else running. The SGLang venv: bash scripts/install_sglang.sh.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_amx-ship}
CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192}'
PROFILE=sglang_reanchor/assets/smollm2-135m-dflash-b16/cost_profile.xeon-amx-bf16.json
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults chain-cost \
    --concurrency 1 2 4 8 16 --requests 32 --cost-profile $PROFILE --chain-config "$CHAIN" --out $OUT/load_v8
