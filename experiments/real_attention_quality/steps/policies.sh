# Quality per fetch-cap policy (issue 16) on SmolLM2-135M, in the last of the calls that bring the model
# (experiments/device.sh: `stash` the pieces of the earlier calls, the gguf wheel carried):
#   OASIS_COMMIT=<hash> [BUDGET_S=420] [DRAFT=...] [E2E_ARGS=...] bash experiments/device.sh real_attention_quality/policies
#   BUDGET_S=420      no engine starts after this many seconds of the matrix (what is left is listed as skipped)
#   DRAFT=experiments/trained_draft_head/smollm2-eagle3   the trained head ("none": the random head)
#   E2E_ARGS=...      extra options, after the ones below (the last wins: e.g. --modes dense proxy lookahead)
# -> $OUT/policies.json, $OUT/policies.log
#
# The matrix: 4K and 8K groups, K = 12.5% (32 / 64 blocks), lookahead with the trained head; per group the usual
# requests (perplexity M = 255, greedy G = 256, passkey at 3 depths) plus 3 context-shift requests (B = N / 4 =
# 1024 / 2048 forced tokens, passkey in B at depth 0.1 / 0.5 / 0.9). Order (the variants' priority, each over both
# groups): dense; lookahead fetch 0.05; lookahead drift, per-layer:0.05 (the fixed cap's total, spread by drift), recall:0.9, budget:0.5; lookahead
# unlimited (fetch 1.0) -- 14 engines.
#
# Run-time estimate, from results/endtoend_h200*.json (the same engine, bf16, CUDA graphs, trained head): an engine
# of 255 decode steps took 4.8-6.5 s at 8K and 3.5-4.8 s at 4K for lookahead (2.8 / 1.6 s dense), prefill included,
# i.e. at most 25 / 19 ms a step, about 12-16 / 10-13 ms once a prefill of ~2 s is taken off. The shift requests
# make an engine decode N / 4 + 16 steps (2064 at 8K, 1040 at 4K) instead of 256: about 30-35 s per lookahead
# engine at 8K and ~15 s at 4K (dense ~12 / ~7 s), so the 14 engines take ~5 min (~300 s) after the model load
# (~25 s). At the upper bound (25 / 19 ms a step: 55 / 22 s an engine) they would take ~490 s, and the budget of
# 420 s would skip the last variant (lookahead unlimited) at one or both lengths: that is why it comes last.
need_model || exit 1
DEADLINE_S=${DEADLINE_S:-550}
BUDGET_S=${BUDGET_S:-420}
DRAFT=${DRAFT:-experiments/trained_draft_head/smollm2-eagle3}
DRAFT_ARGS=()
[ "$DRAFT" != none ] && DRAFT_ARGS=(--draft-path "$DRAFT")
# the model load before the budget clock starts, the last engine started inside it: ~100 s past BUDGET_S at most
T=$(min $(( BUDGET_S + 100 )) $(( $(left) - 5 )))
say "policies: budget ${BUDGET_S} s, timeout ${T} s"
# shellcheck disable=SC2086
timeout "$T" $PY -m oasis_exec quality endtoend --model-path "$M" --device cuda "${DRAFT_ARGS[@]}" \
  --lengths 4096 8192 --k-fracs 0.125 --modes dense lookahead --drafts head \
  --fetch-ratios 0.05 1.0 --fetch-policies drift per-layer:0.05 recall:0.9 budget:0.5 \
  --shift-lengths 4096 8192 --time-budget-s "$BUDGET_S" \
  --out "$OUT/policies.json" ${E2E_ARGS:-} 2>&1 \
  | tr '\r' '\n' | grep -v -e Warning -e clean_up_tokenization | tee "$OUT/policies.log" | grep -v -E 'engine(/s)?\]$'
echo "rc=${PIPESTATUS[0]}"
