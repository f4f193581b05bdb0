# Issue 37: train the long-context attention draft head for SmolLM2-135M (sequences of 8,192 tokens: its limit) and
# score it by position bucket beside today's single-key head, in the last of the calls that bring the model
# (experiments/device.sh: `stash` the pieces of the earlier calls):
#   OASIS_COMMIT=<sha> bash experiments/device.sh long_context_draft/train_smollm2
# HEAD=single trains a single-key head on the same data instead (the architecture apart from the data).
# -> $OUT/smollm2-<head>-8k/ (model.safetensors, config.json with the provenance, accept.json), train.log,
# with DRAFT_COST=1 draft_cost.txt (the attention head's K/V bytes and time a step beside the single-key head's;
# measured 2026-12-06: results/train_h100_1cd1217/run1_draft_cost.txt). ~9 min at MAX_TRAIN_S=300. DATA / N_TRAIN: a
# larger corpus (train_long.py corpus --n-train 768) and how many of its windows to use.
# EVAL_GEN=-1 skips the evaluation (then steps/accept_smollm2.sh in the next call); 0: teacher-forced only. STEPS (12000):
# the schedule's length (on the big corpus 12,000 steps took 173 s on an H100: the cap, not MAX_TRAIN_S, ended it).
need_model || exit 1
D=experiments/long_context_draft
H=${HEAD:-attn}
timeout -k 10 "${TRAIN_S:-560}" $PY $D/train_long.py train --model-path "$M" --data "${DATA:-$D/data/smollm2_8k.npz}" \
  --out "$OUT/smollm2-$H-8k" --head "$H" --n-train "${N_TRAIN:-64}" --n-gen 16 --gen-len 1024 --gen-batch 8 --feat-batch 4 \
  --steps "${STEPS:-12000}" --max-seconds "${MAX_TRAIN_S:-300}" --seqs 2 --picks 4096 --lr 1e-3 \
  --eval-gen "${EVAL_GEN:-256}" --eval-seqs 4 --val-windows "${VAL_WINDOWS:-0}" --compare experiments/trained_draft_head/smollm2-eagle3 ${TRAIN_ARGS:-} \
  2>&1 | grep --line-buffered -v Warning | tee "$OUT/train.log"
say "train rc=${PIPESTATUS[0]}"
if [ "${DRAFT_COST:-0}" = 1 ]; then
  timeout -k 5 90 $PY $D/draft_cost.py --device cuda --iters 50 2>&1 | tee "$OUT/draft_cost.txt"
  say "draft_cost rc=${PIPESTATUS[0]}"
fi
