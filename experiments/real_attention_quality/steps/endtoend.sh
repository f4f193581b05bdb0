# The end-to-end quality matrix (python -m oasis_exec quality endtoend) on SmolLM2-135M, in the last of the calls
# that bring the model (experiments/device.sh: `stash` the pieces of the earlier calls, the gguf wheel carried):
#   OASIS_COMMIT=<hash> [BUDGET_S=190] [DRAFT=...] [E2E_ARGS=...] bash experiments/device.sh real_attention_quality/endtoend
#   BUDGET_S=190      no engine starts after this many seconds of the matrix (what is left is listed as skipped)
#   DRAFT=experiments/trained_draft_head/smollm2-eagle3   the trained head ("none": the random head)
#   E2E_ARGS=...      extra options (e.g. --quick, --drafts head oracle, --lengths 2048 8192)
# -> $OUT/endtoend.json, $OUT/endtoend.log
need_model || exit 1
DRAFT=${DRAFT:-experiments/trained_draft_head/smollm2-eagle3}
DRAFT_ARGS=()
[ "$DRAFT" != none ] && DRAFT_ARGS=(--draft-path "$DRAFT")
# 2K / 4K / 8K groups; dense, then every sparse mode at K = all blocks of the 2K group (must equal dense up to bf16
# rounding), then lookahead / proxy / quest / retrieval at K = 12.5% and 25%, fetch 0.05 first, then 0.02, 0.10, all.
timeout $(( ${BUDGET_S:-190} + 45 )) $PY -m oasis_exec quality endtoend --model-path "$M" \
  --device cuda "${DRAFT_ARGS[@]}" --full-k-check 2048 --time-budget-s "${BUDGET_S:-190}" \
  --out "$OUT/endtoend.json" ${E2E_ARGS:-} 2>&1 \
  | tr '\r' '\n' | grep -v -e Warning -e clean_up_tokenization | tee "$OUT/endtoend.log" | grep -v -E 'engine(/s)?\]$'
echo "rc=${PIPESTATUS[0]}"
