#!/usr/bin/env bash
# Issue 26 on a 2-core AMD EPYC Zen 4 with AVX-512 BF16 (no AMX), drafter v8 shipped: this CPU's default (measured
# again with v8 by `scripts/ship_device_defaults.py --repeats 5`) against the DFlash chain, the AMX default (one
# shifted row + four 3-token branches, uncut and cut at 0.1), branching alone, one shifted row, the cut chain (the
# fastest method on this CPU with v7) and plain decoding in both dtypes; and the
# DSpark and Domino heads shipped on v8 with branching on their own corrected distributions (new: branches are
# no longer DFlash-only in the engine). T = 0 and T = 1, every method interleaved per sample. One process on both
# cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A=sglang_reanchor/assets
lscpu > $OUT/lscpu.txt
D6="max_depth=6,draft_vocab=8192"
BR="branch_width=2,branch_rows=4,branch_length=3"
ZEN4="policy=offset,offsets=1,$D6,node_budget=9,verify_threshold=0.3"   # this CPU's default (device_defaults.json)
AMX="policy=offset,offsets=1,$BR,$D6,node_budget=16"                   # the AMX Xeon's default
ALONE="offsets=,$BR,$D6,node_budget=24"                                # branching alone
ROW="policy=offset,offsets=1,$D6,node_budget=8"                        # one shifted row, no branches
METHODS=(target target:dtype=float32 "dflash:$D6" "dflash:$D6,verify_threshold=0.1" "reanchor:$ZEN4"
         "reanchor:$AMX" "reanchor:$AMX,verify_threshold=0.1" "reanchor:$ALONE" "reanchor:$ROW")
BENCH=($PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64
       --threads 2 --no-trace)
"${BENCH[@]}" --extra-drafter ds=$A/smollm2-135m-dspark-b16 --extra-drafter dm=$A/smollm2-135m-domino-b16 \
    --limit 10 --methods "${METHODS[@]}" \
    "dflash:$D6,drafter=dm" "reanchor:$ROW,drafter=dm" "reanchor:$AMX,drafter=dm" "reanchor:$ALONE,drafter=dm" \
    "dflash:$D6,drafter=ds" "reanchor:$ROW,drafter=ds" "reanchor:$AMX,drafter=ds" \
    --out $OUT/bench_t0
"${BENCH[@]}" --limit 5 --methods "${METHODS[@]::7}" --temperature 1.0 --out $OUT/bench_t1
