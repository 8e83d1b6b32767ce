#!/usr/bin/env bash
# Export the heads fine-tuned on v8's backbone (run_heads.sh) and validate them beside v8 and the shipped
# (v7-backbone) heads: teacher-forced block acceptance on the 512 held-out responses, paired against v8.
set -euo pipefail
OUT=${OUT:-results/2026-12-07_amx-ship}
PY=${PY:-.venv/bin/python}
E=/work/runs/heads_v8/export
mkdir -p $E $OUT/training
rm -rf $E/dflash-v8 && cp -r results/2026-12-07_amx-served-c1/v8_drafter $E/dflash-v8
for fam in dspark domino; do
    $PY -m sglang_reanchor.train export --ckpt /work/runs/heads_v8/run_$fam/ckpt.pt --out $E/$fam-v8
    cp sglang_reanchor/assets/smollm2-135m-$fam-b16/draft_vocab.safetensors $E/$fam-v8/
    cp /work/runs/heads_v8/run_$fam/log.jsonl $OUT/training/log_$fam-v8.jsonl
    cp $E/$fam-v8/training.json $OUT/training/training_$fam-v8.json
done
$PY -m sglang_reanchor.train validate --drafter $E/dflash-v8 $E/dspark-v8 $E/domino-v8 \
    sglang_reanchor/assets/smollm2-135m-dspark-b16 sglang_reanchor/assets/smollm2-135m-domino-b16 \
    --val-data /work/runs/v7/data/val --out $OUT/training/validate_heads_v8.json
