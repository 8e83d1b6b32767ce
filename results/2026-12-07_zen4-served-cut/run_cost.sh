#!/usr/bin/env bash
# After run_served.sh: a cost profile of this Zen 4 (reference engine, bfloat16, drafter v8 shipped), then the
# batch-aware budget with it, served: REANCHOR with this CPU's entry (D = {1}, 9 nodes, depth 6, draft_vocab 8192,
# cut 0.3) and the chain cut at 0.1 (depth 6, draft_vocab 8192), both with the profile, beside plain SGLang;
# the same load as run_served.sh (32 x 32 greedy tokens per level, two interleaved passes), nothing else running.
set -euo pipefail
PY=${PY:-.venv/bin/python}
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-served-cut}
DEF='{"offsets":[1],"policy":"offset","node_budget":9,"max_depth":6,"draft_vocab":8192,"verify_threshold":0.3}'
CUT_CHAIN='{"offsets":[],"max_depth":6,"draft_vocab":8192,"verify_threshold":0.1}'
$PY -m sglang_reanchor.bench cost --datasets gsm8k humaneval --skip 50 --limit 2 --max-new-tokens 64 \
    --sweep-offsets 1 --repeats 3 --threads 2 --dtype bfloat16 --out $OUT/cost
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain reanchor-cost chain-cost \
    --concurrency 1 2 4 8 16 --requests 32 --cost-profile $OUT/cost/cost_profile.json \
    --chain-config "$CUT_CHAIN" --reanchor-config "$DEF" --interleave 2 --out $OUT/load_cost
