# Issue 37: Gemma 3 270M's attention head scored by position bucket alone, in generation, with more continuations a
# bucket than the training call's evaluation (there: one prefix a bucket x 4 held-out windows x 192 tokens, whose
# greedy buckets move by +-3.5 points and more from one prefix to the next). The model stashed (MODEL_DIR=/tmp/mg, the
# gguf wheel carried: transformers reads the GGUF):
#   WHL=.whl MODEL_DIR=/tmp/mg OASIS_COMMIT=<sha> bash experiments/device.sh long_context_draft/accept_gemma
# HEADS (the committed attention head), GEN tokens a continuation (192), GEN_SEQS held-out windows (4: all there are),
# PREFIXES prefix lengths a bucket (3), TEMPS (0: greedy; '0 0.7' both), TF=1 to add the teacher-forced tables.
# -> $OUT/accept_gemma.json (accept_buckets.evaluate's tables and the counts by prefix), accept.log
DEADLINE_S=${DEADLINE_S:-560}
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M (device.sh defaults to SmolLM2)
need_model || exit 1
D=experiments/long_context_draft
read -r -a heads <<< "${HEADS:-$D/heads/gemma-attn-32k}"
read -r -a temps <<< "${TEMPS:-0}"
TFARG=(--no-teacher-forced); [ "${TF:-0}" = 1 ] && TFARG=()
timeout -k 10 "$(( $(left) - 10 ))" $PY $D/accept_buckets.py --model-path "$M" --data "${DATA:-$D/data/gemma_32k.npz}" \
  --heads "${heads[@]}" --device cuda --gen "${GEN:-192}" --gen-seqs "${GEN_SEQS:-4}" --prefixes "${PREFIXES:-3}" \
  --temps "${temps[@]}" "${TFARG[@]}" --max-seconds "$(( $(left) - 60 ))" --out "$OUT/accept_gemma.json" \
  2>&1 | grep --line-buffered -v Warning | tee "$OUT/accept.log" | tail -30
say "accept rc=${PIPESTATUS[0]}"
