# Issue 37: SmolLM2-135M's draft heads scored by position bucket alone (after a training call that skipped its own
# evaluation, EVAL_GEN=-1), the model stashed (MODEL_DIR) or carried:
#   MODEL_DIR=/tmp/ms OASIS_COMMIT=<sha> bash experiments/device.sh long_context_draft/accept_smollm2
# HEADS (default: the committed attention head and today's single-key head), GEN tokens a generated continuation
# (192), GEN_SEQS continuations a bucket (4), DATA (the small corpus file: its held-out windows and the licences are
# the big one's). -> $OUT/accept_smollm2.json (accept_buckets.evaluate's tables, one a head)
DEADLINE_S=${DEADLINE_S:-560}
need_model || exit 1
D=experiments/long_context_draft
read -r -a heads <<< "${HEADS:-$D/heads/smollm2-attn-8k experiments/trained_draft_head/smollm2-eagle3}"
timeout -k 10 "$(( $(left) - 10 ))" $PY $D/accept_buckets.py --model-path "$M" --data "${DATA:-$D/data/smollm2_8k.npz}" \
  --heads "${heads[@]}" --device cuda --gen "${GEN:-192}" --gen-seqs "${GEN_SEQS:-4}" --out "$OUT/accept_smollm2.json" \
  2>&1 | grep --line-buffered -v Warning | tee "$OUT/accept.log" | tail -30
say "accept rc=${PIPESTATUS[0]}"
