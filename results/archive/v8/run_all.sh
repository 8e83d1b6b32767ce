#!/usr/bin/env bash
# The exact commands behind results/v8/ (2026-12-02, the 2-core AMD EPYC Zen 4 machine, AVX-512 BF16,
# bfloat16 via dtype=auto, one process, nothing else running during the benchmark run). The v6 drafter:
# the shipped v5 folder fine-tuned on the 10,496-response pool.
set -euo pipefail
PY=${PY:-python}
# 1. the data folder, rebuilt from the committed pack (features only: 82 shards, ~45 s each; the
#    mixed shard 82, 127 stored + 1 new response, and the 42 longest shards were not built)
$PY -m sglang_reanchor.train prompts --out /work/train_work/pool_v3.jsonl
$PY -m sglang_reanchor.train data --out /work/train_work/p0 --prompts /work/train_work/pool_v3.jsonl \
    --sort-window 1024 --max-prompt-tokens 384 --max-new-tokens 192 --batch-size 128 \
    --pack train_data/smollm2-135m-instruct/responses_pool_v3.npz      # stopped after shard_00081
# 2. the fine-tune (64 minutes of wall clock; the cosine schedule ends with the budget)
$PY -m sglang_reanchor.train fit --data /work/train_work/p0 --out /work/train_work/run6 \
    --init-from sglang_reanchor/assets/smollm2-135m-dflash-b16 --minutes 64 --steps 100000 \
    --lr 3e-4 --warmup 20 --batch-seqs 16 --anchors 16 --gamma 5 --eval-every 200 --save-every 25 \
    --val-prompts 4 --val-tokens 48 --seed 3
D=/work/train_work/v6_drafter
$PY -m sglang_reanchor.train export --ckpt /work/train_work/run6/ckpt.pt --out $D
$PY -m sglang_reanchor.train draft-vocab --data /work/train_work/p0 --drafter $D
$PY -m sglang_reanchor.train curve --log /work/train_work/run6/log.jsonl --out results/v8/training \
    --title "v6: v5 fine-tuned on 10,496 pool responses"
# 3. the drafter choice on development prompts (samples 50-51 of each dataset; the same command as
#    results/v5/dev_drafter_choice, whose v5 run is the comparison)
$PY -m sglang_reanchor.bench --drafter $D --datasets gsm8k humaneval mt-bench aime25 --skip 50 --limit 2 \
    --max-new-tokens 48 --threads 2 --no-trace --methods dflash --out results/v8/dev_drafter_choice/v6_drafter
# 4. the learning curve across drafters (tau read from the stored development runs)
$PY -m sglang_reanchor.train learning-curve --goal 3.0 --out results/v8/learning_curve \
    --title "DFlash tau on development prompts against training data" \
    --point v2:177633:-:results/v4/dev_drafter_choice/v2_drafter/results.json \
    --point v4:627936:3774419:results/v4/dev_drafter_choice/v4_drafter/results.json \
    --point v5:1424565:7262088:results/v5/dev_drafter_choice/run5_drafter/results.json \
    --point v6:1671713:11762609:results/v8/dev_drafter_choice/v6_drafter/results.json
