#!/usr/bin/env bash
# Issue 26 on a 2-core Xeon with AMX-BF16, drafter v8 shipped: the library's default for this CPU (re-measured
# with v8 by `scripts/ship_device_defaults.py`, the same choice as with v7) against the DFlash chain (uncut and
# cut), branching alone, ReAnchor's one shifted row and plain decoding in both dtypes, T = 0 and T = 1; then the
# chain, the default and the one-row ReAnchor with v7 (the previous default drafter, sha256 3ec5d29a511d) and with
# the DSpark and Domino heads now on v8's backbone, in the same run (samples interleaved). The methods and samples of
# results/2026-12-05_amx-defaults_v7-3ec5d29a511d/run_all.sh. One process on both cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A=sglang_reanchor/assets
V7=${V7:-/work/runs/v7_drafter}   # the v7 folder: git show 814d8c7:sglang_reanchor/assets/smollm2-135m-dflash-b16/...
lscpu > $OUT/lscpu.txt
D6="max_depth=6,draft_vocab=8192"
BR="branch_width=2,branch_rows=4,branch_length=3"
METHODS=(target target:dtype=float32
         "dflash:$D6" "dflash:$D6,verify_threshold=0.1"
         "reanchor:policy=offset,offsets=1,$BR,$D6,node_budget=16"        # this CPU's default
         "reanchor:offsets=,$BR,$D6,node_budget=24"                       # branching alone
         "reanchor:policy=offset,offsets=1,$D6,node_budget=8")            # one shifted row, no branches
BENCH=($PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64
       --threads 2 --no-trace)
V8DEF="policy=offset,offsets=1,$BR,$D6,node_budget=16"
ROW="policy=offset,offsets=1,$D6,node_budget=8"    # (branching needs a DFlash head: one row for DSpark, Domino)
"${BENCH[@]}" --extra-drafter v7=$V7 --extra-drafter ds=$A/smollm2-135m-dspark-b16 \
    --extra-drafter dm=$A/smollm2-135m-domino-b16 --limit 10 --methods "${METHODS[@]}" \
    "dflash:$D6,drafter=v7" "reanchor:$V8DEF,drafter=v7" "reanchor:$ROW,drafter=v7" \
    "dflash:$D6,drafter=ds" "reanchor:$ROW,drafter=ds" "dflash:$D6,drafter=dm" "reanchor:$ROW,drafter=dm" \
    --out $OUT/bench_t0
"${BENCH[@]}" --limit 5 --methods "${METHODS[@]::6}" --temperature 1.0 --out $OUT/bench_t1
