#!/usr/bin/env bash
# Issue 26 on a 2-core AMD EPYC Zen 4 with AVX-512 BF16 (no AMX): DDTree's best-first tree
# (`branch_shape=best_first`: paths may leave the baseline more than once) against the branches as chains
# (one runner-up, then the baseline's drafts), at the same node budgets, alone and with one shifted row,
# on drafter v8 and its Domino head; the DFlash chain and plain decoding beside them. T = 0, every method
# interleaved per sample, one process on both cores, nothing else running.
set -euo pipefail
OUT=${OUT:-$(cd "$(dirname "$0")" && pwd)}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A=sglang_reanchor/assets
lscpu > $OUT/lscpu.txt
D6="max_depth=6,draft_vocab=8192"
CH="offsets=,branch_width=2,branch_rows=4,branch_length=3,$D6,node_budget=24"        # chains alone (19 nodes)
BF="offsets=,branch_width=2,branch_rows=16,branch_length=6,branch_shape=best_first,$D6"  # best-first alone
ROWBF="policy=offset,offsets=1,branch_width=2,branch_rows=16,branch_length=6,branch_shape=best_first,$D6"
BENCH=($PY -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 --max-new-tokens 64
       --threads 2 --no-trace)
"${BENCH[@]}" --extra-drafter dm=$A/smollm2-135m-domino-b16 --limit ${LIMIT:-6} --methods \
    target "dflash:$D6" "reanchor:$CH" "reanchor:$BF,node_budget=20" "reanchor:$BF,node_budget=32" \
    "reanchor:$BF,node_budget=48" "reanchor:$ROWBF,node_budget=24" "reanchor:$BF,node_budget=20,branch_temperature=2.0" \
    "dflash:$D6,drafter=dm" "reanchor:$CH,drafter=dm" "reanchor:$BF,node_budget=20,drafter=dm" \
    "reanchor:$BF,node_budget=32,drafter=dm" "reanchor:$BF,node_budget=48,drafter=dm" \
    --out $OUT/bench_t0
