#!/usr/bin/env bash
# The commands behind results/2026-12-06_amx-served-decode-roots/: SGLang serving on a 2-core
# "Intel(R) Xeon(R) Processor" with AMX-BF16 and AVX-512 BF16 (lscpu.txt), SmolLM2-135M-Instruct + the
# shipped drafter v7 (sha256 prefix 3ec5d29a511d), bfloat16, one server at a time, nothing else running;
# closed-loop clients, 32 greedy tokens per request (ignore_eos), 32 requests per concurrency level.
# A round whose trees are all their roots alone now runs as the target's plain decode step
# (ReAnchorWorker._decode_roots). The SGLang venv: bash scripts/install_sglang.sh.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-06_amx-served-decode-roots}
lscpu > $OUT/lscpu.txt
CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192}'
DEF='{"policy":"offset","offsets":[1],"node_budget":16,"max_depth":6,"draft_vocab":8192,"branch_width":2,"branch_rows":4,"branch_length":3}'
PROFILE=results/2026-12-05_amx-served_v7-3ec5d29a511d/cost/cost_profile.json  # this CPU kind, drafter v7

# 1. Every round the root alone (batch_node_budget 1) against plain SGLang: what a root-alone round costs now.
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain chain-batch --batch-node-budget 1 \
    --concurrency 4 16 --requests 32 --chain-config "$CHAIN" --out $OUT/load_bf16_roots

# 2. The chain and the engine's default with batch_node_budget 16 and with the cost-profile budget.
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain chain-batch reanchor-batch chain-cost reanchor-cost \
    --concurrency 1 2 4 8 16 --requests 32 --batch-node-budget 16 --cost-profile $PROFILE \
    --chain-config "$CHAIN" --reanchor-config "$DEF" --out $OUT/load_bf16

# 3. py-spy of a root-alone round at 16 clients (as results/2026-12-05_amx-served_v7-3ec5d29a511d step 4).
V7=results/2026-12-05_amx-served_v7-3ec5d29a511d
mkdir -p /tmp/prof
TRITON_INTERPRET=1 $SGL $V7/profile_c16.py root "$(echo "$CHAIN" | sed 's/}$/,"batch_node_budget":1}/')" 16 /tmp/prof
python $V7/summarise.py /tmp/prof/root.txt > $OUT/profile_roots_c16.txt

# 4. What a server serves with nothing set (the AMX entry of device_defaults.json now ships the profile of
#    step 2 as served.cost_profile), against plain SGLang.
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults \
    --concurrency 1 2 4 8 16 --requests 32 --out $OUT/load_defaults

# 5. Root-alone rounds against plain SGLang with and without its overlap event loop, alternated (16 clients).
TRITON_INTERPRET=1 $SGL $OUT/ab_roots_c16.py $OUT/ab_roots_c16.json
