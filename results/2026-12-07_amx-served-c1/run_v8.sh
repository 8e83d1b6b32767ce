#!/bin/bash
# A v8 drafter run aimed at chat: the shipped v7 drafter trained further with the v7 recipe
# (docs/training.md) but "other" prompts (ShareGPT, CodeI/O, chat, general) drawn three times as
# often as math or stubs, at a lower peak rate (fine-tuning a trained drafter). Data: the v7 folders
# (results/2026-12-02_v7-recipe_v6-4dd68a761ab8/build_data.sh); a folder still being built is picked
# up as its shards appear. Resumes /work/runs/v8/run/ckpt.pt when it exists: kill it and re-run.
# (Started on 2026-12-07 with --steps 900 --minutes 75 --eval-every 450 --snapshot-every 450; a step took
# 1.3 s once the data was built, so it was stopped at step 200 and resumed with the settings below.)
cd /work/main
mkdir -p /work/runs/v8/run
exec nice -n 19 .venv/bin/python -m sglang_reanchor.train fit --resume \
  --data /work/runs/v7/data/bench /work/runs/v7/data/other0 /work/runs/v7/data/other \
  --val-data /work/runs/v7/data/val --out /work/runs/v8/run \
  --init-from sglang_reanchor/assets/smollm2-135m-dflash-b16 \
  --lr 2e-4 --warmup 30 --steps 2400 --minutes 55 --batch-seqs 16 --anchors 16 --gamma 2 --all-slots \
  --max-offset 95 --draft-vocab 8192 --mix math=1,stub=1,other=3 \
  --eval-every 400 --save-every 25 --save-minutes 8 --snapshot-every 400 --reload-every 25 \
  --val-prompts 0 --val-anchors 8 --val-max-offset 95 --seed 8 >> /work/runs/v8/run/train.log 2>&1
