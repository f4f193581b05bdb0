# Issue 37, end to end: long-context task accuracy (passkey at 10/25/50/75/90% depth, 4 named keys with one asked,
# variable tracking over 4 hops with a decoy chain; 5 tasks a group, 35 in all) on SmolLM2-135M at 8K through the
# engine, per mode (dense, lookahead, proxy, retrieval) at K = 256 blocks (of 512) and fetch 0.05 (K=64 for a
# quarter); a group counts only where dense solves it at >= 80% (the JSON lists the dropped ones). The tasks are token
# ids made here (experiments/long_context_draft/tasks/smollm2_8k.json, filler: traces/texts); the continuations are
# decoded by the project's tokenizer from the GGUF metadata.
#   OASIS_COMMIT=<sha> [K=256] [FETCH=0.05] [HEAD=attn|single] [HEAD_ATTN=dir] \
#     bash experiments/device.sh long_context_draft/tasks_smollm2
# Drafts: HEAD=attn (default; the trained attention head, heads/smollm2-attn-8k, when committed) or single (today's
# head, experiments/trained_draft_head/smollm2-eagle3), the same with prompt lookup beside it (head_ngram), and the
# oracle. -> $OUT/tasks_smollm2_8192.json/.txt. ~6 min.
need_model || exit 1
D=experiments/long_context_draft
HA=${HEAD_ATTN:-$D/heads/smollm2-attn-8k}
if [ "${HEAD:-attn}" = attn ] && [ -d "$HA" ]; then DR=(--drafts head head_ngram oracle --draft-path "$HA" --draft-head attn)
else
  [ "${HEAD:-attn}" = attn ] && say "no attention head at $HA: today's single-key head instead"
  DR=(--drafts head head_ngram oracle --draft-path experiments/trained_draft_head/smollm2-eagle3 --draft-head single)
fi
timeout -k 10 "${TASKS_S:-570}" $PY -m oasis_exec quality tasks --model-path "$M" \
  --tasks-file $D/tasks/smollm2_8k.json --lengths 8192 --modes dense lookahead proxy retrieval \
  --top-k "${K:-256}" --fetch-ratios "${FETCH:-0.05}" "${DR[@]}" --max-lanes "${LANES:-8}" --tokenizer gguf \
  --device cuda --dtype bfloat16 --time-budget-s "${BUDGET_S:-480}" --commit "$OASIS_COMMIT" \
  --out "$OUT/tasks_smollm2_8192.json" 2>&1 | grep -v -E 'Warning|it/s\]' | tee "$OUT/tasks_smollm2_8192.txt"
say "tasks rc=${PIPESTATUS[0]}"
