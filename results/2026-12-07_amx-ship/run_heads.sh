#!/bin/bash
# The DSpark and Domino heads moved onto v8's backbone and fine-tuned there, head only (backbone frozen), one
# core each, side by side. Resumable: re-run. HEADS_V7 holds the heads as shipped on v7's backbone:
#   git show 814d8c7:sglang_reanchor/assets/smollm2-135m-{dspark,domino}-b16/... (the commit before v8 shipped)
# (On 2026-12-07 the composed folders came from a one-off script that did what `add-head --head-from` does; the
# command gives the same tensors, byte for byte, checked.)
cd /work/main
HEADS_V7=${HEADS_V7:-/tmp/heads_v7}
for fam in dspark domino; do
  .venv/bin/python -m sglang_reanchor.train add-head --drafter results/2026-12-07_amx-served-c1/v8_drafter \
    --head-from $HEADS_V7/$fam --out /work/runs/heads_v8/$fam
  seed=$([ $fam = dspark ] && echo 11 || echo 13)
  mkdir -p /work/runs/heads_v8/run_$fam
  OMP_NUM_THREADS=1 nohup nice -n 19 .venv/bin/python -m sglang_reanchor.train fit --resume --head-only \
    --data /work/runs/v7/data/bench /work/runs/v7/data/other0 /work/runs/v7/data/other \
    --val-data /work/runs/v7/data/val --out /work/runs/heads_v8/run_$fam --init-from /work/runs/heads_v8/$fam \
    --lr 1e-3 --warmup 20 --steps 500 --minutes 35 --batch-seqs 16 --anchors 16 --gamma 2 --all-slots \
    --max-offset 95 --draft-vocab 8192 --mix math=1,stub=1,other=1 --eval-every 250 --save-every 25 \
    --save-minutes 8 --val-prompts 0 --val-anchors 8 --val-max-offset 95 --seed $seed \
    >> /work/runs/heads_v8/run_$fam/train.log 2>&1 &
done
wait
