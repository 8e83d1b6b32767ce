#!/usr/bin/env bash
# Where the roots-alone rounds of 8 and 16 clients stand: plain SGLang (overlap scheduling, its default), plain
# SGLang in the synchronous loop REANCHOR's worker runs in (plain-sync, --disable-overlap-schedule), and REANCHOR
# with nothing set (its batches of two or more verify their roots alone); 2-core Zen 4, bfloat16, interleaved x3.
set -euo pipefail
SGL=${SGL:-build/sglang-venv/bin/python}
OUT=${OUT:-results/2026-12-07_zen4-roots}
TRITON_INTERPRET=1 $SGL scripts/load_bench.py --dtype bfloat16 --methods plain plain-sync defaults \
    --concurrency 8 16 --requests 48 --interleave 3 --out $OUT/load_sync
