# Train the draft head (oasis_exec.tools.draft_train) on the real model and smoke-test every mode on the GPU, in the
# last of the calls that bring the model (experiments/device.sh: `stash` the pieces of the earlier calls):
#   OASIS_COMMIT=<hash> [TRAIN_ARGS="--steps 5000 --batch 4096"] bash experiments/device.sh trained_draft_head/train
# -> $OUT/smollm2-eagle3/ (the head), train.log, smoke.log
need_model || exit 1
$PY -c 'import transformers; print("transformers", transformers.__version__)' >> "$OUT/device.txt" 2>&1
$PY -m oasis_exec.tools.draft_train train --model-path "$M" --corpus experiments/trained_draft_head/prompts.npz \
  --out "$OUT/smollm2-eagle3" ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log"
timeout 240 $PY experiments/trained_draft_head/smoke_gpu.py "$M" traces/texts/GPL-3.txt \
  --draft-path "$OUT/smollm2-eagle3" 2>&1 | grep -v Warning | tee "$OUT/smoke.log"
