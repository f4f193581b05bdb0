# Issue 37, end to end: perplexity (teacher-forced, 255 tokens) and greedy agreement with dense (256 tokens) on Gemma
# 3 270M at 32K -- the goal "lookahead's perplexity within 1% of dense at K = 256 blocks and fetch 0.05" -- per mode
# (dense, lookahead with the trained attention head and with prompt lookup beside it, proxy, retrieval) and block
# scorer (SCORERS: the engine's default and `tokens` with Gemma's committed basis). The text is the Debian licences
# joined, as token ids made here (data/gemma_32k.npz:text:licences; no tokenizer runs on the device), plus held-out
# window 0; traces/texts holds no 32K-token text.
# TEXTS: other token texts (e.g. the licences and held:0 .. held:3, 5 x 255 tokens).
#   MODEL_DIR=/tmp/mg OASIS_COMMIT=<sha> [N=32768] [TEXTS='...'] [HEAD_ATTN=dir] [SCORERS='minmax_sum+sink tokens'] [DRAFTS='head'] [MODES='dense lookahead'] [GATES='0 0.5'] \
#     bash experiments/device.sh long_context_draft/endtoend_gemma        -> $OUT/endtoend_gemma_<N>.json/.txt
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M
need_model || exit 1
D=experiments/long_context_draft
N=${N:-32768}
HA=${HEAD_ATTN:-$D/heads/gemma-attn-32k}
timeout -k 10 "${E2E_S:-560}" $PY -m oasis_exec quality endtoend --model-path "$M" --device cuda --dtype bfloat16 \
  --draft-path "$HA" --draft-head attn --drafts ${DRAFTS:-head head_ngram} --draft-gates ${GATES:-0} --modes ${MODES:-dense lookahead proxy retrieval} \
  --top-k "${K:-256}" --fetch-ratios "${FETCH:-0.05}" --block-scores ${SCORERS:-minmax_sum+sink tokens} \
  --token-basis experiments/block_scorers/calib/gemma3_270m_basis.npz --lengths "$N" --passkey-lengths --texts \
  --token-texts ${TEXTS:-$D/data/gemma_32k.npz:text:licences $D/data/gemma_32k.npz:held:0} \
  --time-budget-s "${BUDGET_S:-480}" --commit "$OASIS_COMMIT" --out "$OUT/endtoend_gemma_$N.json" 2>&1 \
  | grep -v -E 'Warning|it/s\]' | tee "$OUT/endtoend_gemma_$N.txt"
say "endtoend rc=${PIPESTATUS[0]}"
