#!/bin/bash
# v7 data folders (issue 25): features of prompt + first 96 response tokens of the stored pool
# responses (train_data/smollm2-135m-instruct/responses_pool_v3.npz), float32 on this AVX2 machine.
# Resumable: re-run to continue (finished shards are skipped). Order: the held-out folder, a first
# 256 "other" sequences (so training can start with every group), the math+stub folder, the rest.
set -e
cd /work/main
while [ -n "$WAIT_PID" ] && kill -0 "$WAIT_PID" 2>/dev/null; do sleep 20; done
PY=".venv/bin/python -m sglang_reanchor.train data --prompts /work/runs/v7/pool_v3.jsonl \
 --pack train_data/smollm2-135m-instruct/responses_pool_v3.npz --pack-only --max-response-tokens 96 \
 --sort-window 1024 --max-prompt-tokens 384 --batch-size 128 --num-val 0"
KEYS=train_data/smollm2-135m-instruct/heldout_v7_keys.txt
D=/work/runs/v7/data
$PY --out $D/val --keys $KEYS
$PY --out $D/other0 --exclude-keys $KEYS --group other --max-prompts 256
$PY --out $D/bench --exclude-keys $KEYS --group math --group stub
$PY --out $D/other --exclude-keys $KEYS --group other --exclude $D/other0
echo BUILD_DONE
