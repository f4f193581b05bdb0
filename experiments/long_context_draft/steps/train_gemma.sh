# Issue 37: train the long-context attention draft head for Gemma 3 270M (sequences of 32,768 tokens: its limit)
# and score it by position bucket, in the last of the calls that bring Gemma's eight pieces (.models/g*/p_??; the
# earlier calls `stash` them into the same MODEL_DIR; the gguf wheel carried):
#   MODEL_DIR=/tmp/mg \
#     OASIS_COMMIT=<sha> bash experiments/device.sh long_context_draft/train_gemma
# The target's features come from transformers (the GGUF dequantised); its tokenizer is never built on the device
# (the corpus is tokenized here, data/gemma_32k.npz: transformers 5.17 converts this GGUF's tokenizer wrongly).
# -> $OUT/gemma-<head>-32k/ (model.safetensors, config.json with the provenance, accept.json), train.log. ~9.5 min.
# The defaults are the first committed head's run (heads/gemma-attn-32k at c3d7419; the head there now went on from it with
# INIT=$D/heads/gemma-attn-32k TRAIN_ARGS="--lr 5e-4" MAX_TRAIN_S=265 EVAL_GEN=-1, 6ec514d): the large corpus
# (data/gemma_32k_big.npz, 190 + 2 validation windows; carry it: the device calls leave *_big.npz untracked),
# MAX_TRAIN_S=220, the evaluation cut by the call's limit. DATA / N_TRAIN / VAL_WINDOWS: another corpus; the small
# one (data/gemma_32k.npz, 24 windows) overfits: a head at 95% on its training batches accepts ~45% held out, and
# going on training the committed head on it for 6,000 steps lost 2-8 points in every generation bucket
# (results/train_gemma_init_h100_f8b34cd/). STEPS (6000): the schedule's length.
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M (device.sh defaults to SmolLM2)
# INIT=<head dir>: go on training from that head (train_long.py --init; e.g. INIT=$D/heads/gemma-attn-32k with its
# model.safetensors carried), its provenance kept in the new head's.
# EVAL_GEN=-1 skips the evaluation (then accept_buckets.py alone in the next call: the heads stay in $OUT); 0: teacher-
# forced only.
need_model || exit 1
D=experiments/long_context_draft
H=${HEAD:-attn}
timeout -k 10 "${TRAIN_S:-580}" $PY $D/train_long.py train --model-path "$M" --data "${DATA:-$D/data/gemma_32k_big.npz}" \
  --out "$OUT/gemma-$H-32k" --head "$H" --n-train "${N_TRAIN:-190}" --n-gen 8 --gen-len 1024 --gen-batch 8 --feat-batch 1 \
  --steps "${STEPS:-6000}" --max-seconds "${MAX_TRAIN_S:-220}" --seqs 1 --picks 2048 --lr 1e-3 \
  --eval-gen "${EVAL_GEN:-128}" --eval-seqs 2 --val-windows "${VAL_WINDOWS:-2}" ${INIT:+--init "$INIT"} ${TRAIN_ARGS:-} 2>&1 | grep --line-buffered -v Warning | tee "$OUT/train.log"
say "train rc=${PIPESTATUS[0]}"
