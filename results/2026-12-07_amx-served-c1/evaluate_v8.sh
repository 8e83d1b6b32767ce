#!/usr/bin/env bash
# Export the v8 run's newest checkpoint and measure it beside the shipped v7 drafter: teacher-forced block
# acceptance on the 512 held-out responses (paired, cluster-robust SE), and generation tau at T = 0 on
# development prompts no result reports (samples 50-51 of each dataset, as results/archive/v8/dev_drafter_choice,
# plus MT-Bench samples 52-59 for chat). Tau only: tokens/s from these runs are not speed figures.
set -euo pipefail
OUT=${OUT:-results/2026-12-07_amx-served-c1}
PY=${PY:-.venv/bin/python}
V7=sglang_reanchor/assets/smollm2-135m-dflash-b16
V8=/work/runs/v8/export
mkdir -p $OUT/training
$PY -m sglang_reanchor.train export --ckpt /work/runs/v8/run/ckpt.pt --out $V8
cp $V7/draft_vocab.safetensors $V8/
cp $V8/training.json $OUT/training/training_v8.json
$PY -m sglang_reanchor.train validate --drafter $V7 $V8 --val-data /work/runs/v7/data/val \
    --out $OUT/training/validate_v7_v8.json
$PY -m sglang_reanchor.train curve --log /work/runs/v8/run/log.jsonl --out $OUT/training/curve
M="dflash:draft_vocab=8192,max_depth=6 reanchor:policy=offset,offsets=1,draft_vocab=8192,max_depth=6"
for name in v7 v8; do
    d=$V7; [ $name = v8 ] && d=$V8
    $PY -m sglang_reanchor.bench run --drafter $d --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 2 \
        --max-new-tokens 48 --no-trace --methods $M --out $OUT/training/dev_$name
    $PY -m sglang_reanchor.bench run --drafter $d --datasets mt-bench --skip 52 --limit 8 \
        --max-new-tokens 48 --no-trace --methods $M --out $OUT/training/chat_$name
done
