# Issue 38: the block scorers on SmolLM2-135M (real weights, bf16, H200), in the last of the calls that bring the
# model (experiments/device.sh: `stash` the pieces of the earlier calls, the gguf wheel carried):
#   OASIS_COMMIT=<sha> bash experiments/device.sh block_scorers/quality   -> selection_scorers.json, e2e_retrieval.json, e2e_lookahead.json, *.log
# 1. selection (python -m oasis_exec quality selection --block-scores): all five texts at 4K and 8K, K = 12.5 / 25 /
#    50% (8K: 64 / 128 / 256 blocks), 64 positions: per scorer mass, best-K mass, recall, proxy, adjacent, and the
#    correct draft's (the text's next token) lookahead agreement through the scorer's own resident set;
# 2. end to end (python -m oasis_exec quality endtoend --block-scores) at 8K, K = 12.5%: dense, then retrieval per
#    scorer (the goal: within 2% of dense; minmax +4.9% on 2026-12-01), then lookahead with the trained head at fetch
#    0.05 per scorer; no passkey (its 3 trials say little); the budget skips what does not fit, and the JSON says so.
#    The scorers (E2E_SCORERS) default to `tokens` at r = 24 with the shipped basis (the engine's auto for a real
#    SmolLM2) and minmax_sum+sink (auto's fallback), then today's minmax.
# SKIP_SELECTION=1 runs part 2 only (with its whole budget).
DEADLINE_S=${DEADLINE_S:-560}
need_model || exit 1
ALL=${SCORERS:-"minmax minmax_sum mean gauss minmax+sink minmax_sum+sink mean+sink gauss+sink"}
E2E=${E2E_SCORERS:-"tokens minmax_sum+sink minmax"}
TOKEN_ARGS="--token-basis experiments/block_scorers/calib/smollm2_135m_basis.npz --token-rank ${TOKEN_RANK:-24}"
DRAFT=experiments/trained_draft_head/smollm2-eagle3
if [ "${SKIP_SELECTION:-0}" != 1 ]; then
say "1. selection"
# shellcheck disable=SC2086
timeout -k 5 $(min 200 $(( $(left) - 300 ))) $PY -m oasis_exec quality selection --model-path "$M" \
  --texts GPL-3 MPL-2.0 Apache-2.0 argparse.py shlex.py --n-tokens 4096 8192 --k-frac 0.125 0.25 0.5 --positions 64 \
  --drafts oracle --device cuda --dtype bfloat16 --block-scores $ALL --no-fit --commit "$OASIS_COMMIT" \
  --out "$OUT/selection_scorers.json" 2>&1 | tr '\r' '\n' | grep -v -i -e warn -e "layer/s" > "$OUT/selection.log"
say "selection rc=${PIPESTATUS[0]}"
fi
for part in retrieval lookahead; do  # retrieval first: the goal; each part its own dense reference
  say "2. end to end: $part"
  B=$(( $(left) - 45 )); [ "$B" -lt 60 ] && { say "no time for $part"; continue; }
  [ $part = lookahead ] || B=$(( B * 2 / 3 ))
  # shellcheck disable=SC2086
  timeout -k 5 $(( B + 40 )) $PY -m oasis_exec quality endtoend --model-path "$M" --device cuda --draft-path "$DRAFT" \
    --lengths 8192 --k-fracs 0.125 --modes dense $part --drafts head --fetch-ratios 0.05 --block-scores $E2E \
    $TOKEN_ARGS \
    --passkey-lengths --time-budget-s "$B" --commit "$OASIS_COMMIT" --out "$OUT/e2e_$part.json" \
    2>&1 | tr '\r' '\n' | grep -v -e Warning -e clean_up_tokenization -E -e 'engine(/s)?\]$' > "$OUT/e2e_$part.log"
  say "e2e $part rc=${PIPESTATUS[0]} $(tail -10 "$OUT/e2e_$part.log")"
done
say "done"
