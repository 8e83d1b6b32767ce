#!/usr/bin/env bash
# The choice for sampled requests on a 2-core Xeon with AMX-BF16 (issue 26): `ship_device_defaults.py
# --temperature 1` (3 repeats of the two built-in prompts, seeded draws at T = 1), then, at T = 1 on held-out
# prompts, plain decoding in both dtypes, the T = 0 default (ReAnchor D = {1} + four branches, 16 nodes), the
# T = 1 choice (D = {1}, 9 nodes, depth 6, verify_threshold 0.3) and DFlash's cut chain, one run.
# SmolLM2-135M-Instruct + the shipped drafter v7, 64 tokens, one process on both cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
lscpu > $OUT/lscpu.txt
$PY scripts/ship_device_defaults.py --dtype auto --temperature 1 | tee $OUT/ship_t1.txt
D6="max_depth=6,draft_vocab=8192"
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64 --threads 2 --no-trace \
    --limit 5 --temperature 1.0 --out $OUT/bench_t1 --methods target target:dtype=float32 \
    "reanchor:policy=offset,offsets=1,branch_width=2,branch_rows=4,branch_length=3,$D6,node_budget=16" \
    "reanchor:policy=offset,offsets=1,node_budget=9,$D6,verify_threshold=0.3" \
    "dflash:$D6,verify_threshold=0.1"
