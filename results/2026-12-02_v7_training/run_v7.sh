#!/bin/bash
# The v7 drafter run (issue 25). Starts the run, or resumes /work/runs/v7/run/ckpt.pt when it exists
# (fp32 weights, AdamW state, step, data cursor): kill it at any moment and re-run this script.
# Data folders: /work/runs/v7/build_data.sh (the copy beside this script); a folder still being built is
# picked up as its shards appear (--reload-every).
cd /work/main
exec nice -n 19 .venv/bin/python -m sglang_reanchor.train fit --resume \
  --data /work/runs/v7/data/bench /work/runs/v7/data/other0 /work/runs/v7/data/other \
  --val-data /work/runs/v7/data/val --out /work/runs/v7/run \
  --init-from sglang_reanchor/assets/smollm2-135m-dflash-b16 \
  --lr 3e-4 --warmup 50 --steps 2000 --batch-seqs 16 --anchors 16 --gamma 2 --all-slots \
  --max-offset 95 --draft-vocab 8192 --mix math=1,stub=1,other=1 \
  --eval-every 200 --save-every 25 --save-minutes 8 --snapshot-every 500 --reload-every 25 \
  --val-prompts 0 --val-anchors 8 --val-max-offset 95 --seed 7 >> /work/runs/v7/run/train.log 2>&1
