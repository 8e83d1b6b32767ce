#!/usr/bin/env bash
# The commands behind results/2026-12-07_amx-served-c1/ (a 2-core "Intel(R) Xeon(R) Processor" with AMX-BF16,
# lscpu.txt): SmolLM2-135M-Instruct + the shipped drafter v7, bfloat16. Steps 1-2 with nothing else running.
# Venvs: .venv (pip install -e '.[test,model,bench,train]') and build/sglang-venv (scripts/install_sglang.sh).
set -euo pipefail
OUT=${OUT:-results/2026-12-07_amx-served-c1}
SGL=${SGL:-build/sglang-venv/bin/python}
PY=${PY:-.venv/bin/python}
lscpu > $OUT/lscpu.txt
export TRITON_INTERPRET=1

# 1. One client, traced: plain SGLang, REANCHOR with nothing set (this CPU kind's served defaults), DFlash's chain.
$SGL scripts/load_bench.py --dtype bfloat16 --methods plain defaults chain \
    --chain-config '{"offsets":[],"max_depth":6,"draft_vocab":8192}' --concurrency 1 --requests 32 --trace \
    --out /tmp/lb_c1
cp /tmp/lb_c1/load.md /tmp/lb_c1/load.json $OUT/load_c1/
for m in defaults chain; do gzip -c /tmp/lb_c1/trace_$m.jsonl > $OUT/load_c1/trace_$m.jsonl.gz
    $SGL scripts/budget_trace.py /tmp/lb_c1/trace_$m.jsonl > $OUT/load_c1/trace_$m.budget.md; done

# 2. py-spy of the same three servers under one client (py-spy: python3 -m venv /tmp/spyvenv &&
#    /tmp/spyvenv/bin/pip install py-spy).
$SGL $OUT/profile_c1.py /tmp/spyvenv/bin/py-spy /tmp/prof_c1 | tee /tmp/prof_c1.log
for n in plain reanchor chain; do gzip -c /tmp/prof_c1/profile_$n.txt > $OUT/profile_c1/profile_$n.txt.gz; done

# 3. The v8 run (resumable; the data folders first: results/2026-12-02_v7-recipe_v6-4dd68a761ab8/build_data.sh,
#    with the prompt pool of `python -m sglang_reanchor.train prompts --out /work/runs/v7/pool_v3.jsonl`).
$PY -m sglang_reanchor.train prompts --out /work/runs/v7/pool_v3.jsonl
bash results/2026-12-02_v7-recipe_v6-4dd68a761ab8/build_data.sh > /work/runs/v7/build.log 2>&1 &
bash $OUT/run_v8.sh
bash $OUT/evaluate_v8.sh

# 4. The chain served at one client with v8, then with v7 (traced: tau per round).
C='{"offsets":[],"max_depth":6,"draft_vocab":8192}'
$SGL scripts/load_bench.py --drafter $OUT/v8_drafter --dtype bfloat16 --methods plain chain --chain-config "$C" \
    --concurrency 1 --requests 32 --trace --out $OUT/load_c1_v8
$SGL scripts/load_bench.py --dtype bfloat16 --methods chain --chain-config "$C" --concurrency 1 --requests 32 \
    --trace --out $OUT/load_c1_v7_chain
