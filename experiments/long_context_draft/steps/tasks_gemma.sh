# Issue 37, end to end: long-context task accuracy (passkey at 10/25/50/75/90% depth, 4 named keys with one asked,
# variable tracking over 4 hops with a decoy chain; 5 tasks a group, 35 a length) on Gemma 3 270M through the engine,
# per mode (dense, lookahead, proxy, retrieval) at K = 256 blocks and fetch 0.05; a group counts only where dense
# solves it at >= 80% (the JSON lists the dropped ones). The tasks are token ids made where a tokenizer runs
# (data: experiments/long_context_draft/tasks/gemma_16k_32k.json, filler: traces/texts); the continuations are decoded
# by the project's tokenizer from the GGUF metadata (oasis_exec.server.tokenizer), not transformers'.
#   MODEL_DIR=/tmp/mg OASIS_COMMIT=<sha> [N=32768|16384] [K=256] [FETCH=0.05] [HEAD_ATTN=dir] [SCORERS='a b'] [DRAFTS='head'] [GATES='0 0.5'] \
#     bash experiments/device.sh long_context_draft/tasks_gemma
# Drafts: the trained attention head (HEAD_ATTN, default heads/gemma-attn-32k, --draft-head attn), the same with the
# engine's prompt lookup beside it (head_ngram: --draft-ngram 2) and the oracle
# (dense's own next token: the bound any draft can reach); without a trained head, oracle and n-gram only (the
# output says so). One call a length (32K first: the goal row). -> $OUT/tasks_gemma_<N>.json/.txt. ~8 min.
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M
need_model || exit 1
D=experiments/long_context_draft
N=${N:-32768}
HA=${HEAD_ATTN:-$D/heads/gemma-attn-32k}
if [ -d "$HA" ]; then DR=(--drafts ${DRAFTS:-head head_ngram oracle} --draft-path "$HA" --draft-head attn)
else say "no attention head at $HA: lookahead with the oracle and n-gram drafts only"; DR=(--drafts oracle ngram); fi
timeout -k 10 "${TASKS_S:-570}" $PY -m oasis_exec quality tasks --model-path "$M" \
  --tasks-file $D/tasks/gemma_16k_32k.json --lengths "$N" --modes ${MODES:-dense lookahead proxy retrieval} \
  --top-k "${K:-256}" --fetch-ratios "${FETCH:-0.05}" "${DR[@]}" --draft-gates ${GATES:-0} --max-lanes "${LANES:-8}" --tokenizer gguf \
  --block-scores ${SCORERS:-minmax_sum+sink} --token-basis experiments/block_scorers/calib/gemma3_270m_basis.npz \
  --device cuda --dtype bfloat16 --time-budget-s "${BUDGET_S:-480}" --commit "$OASIS_COMMIT" \
  --out "$OUT/tasks_gemma_$N.json" 2>&1 | grep -v -E 'Warning|it/s\]' | tee "$OUT/tasks_gemma_$N.txt"
say "tasks rc=${PIPESTATUS[0]}"
