# Sourced by the real-model speculation steps (steps/gemma_spec.sh, steps/smol_attn_spec.sh) after need_model: the
# goal table's runs through spec_study.py, one engine (and prefill) a group: lookahead k = 0, 1 after and k = 0 with
# decode chains of CHAINED (8) steps on an engine of its own (the table's baseline: the ordinary engine's best step),
# lookahead k = 1 beside, dense k = 0, 1; the same GPU KV budget (KV_GB, 3 GB) for every run, the model's own
# selection and acceptance. The step sets HEAD (the draft head's directory), TEXT (spec_study --text, or empty for
# its default), NAME (the output's name: $OUT/$NAME.jsonl, .md, .log) and the defaults CONTEXT, TOP_K, N_DENSE.
# Overrides: SKIP_LOOK=1 (dense only), N_LOOK (64), STEPS (16), WARMUP (6), RUN_S (seconds a group at most),
# SPEC_CHAIN=N (also k = 1 with speculative steps chained N at a time, an engine of its own: 'spec-chained').
spec_run() {  # MODE N SPEC_PREDICT KS...
  local mode=$1 n=$2 sp=$3; shift 3
  local T; T=$(min $(( $(left) - 10 )) "${RUN_S:-150}")
  [ "$T" -lt 30 ] && { say "no time left for $mode $sp"; return; }
  say "$mode $sp k=$* (left $(left)s)"
  local text=(); [ -n "${TEXT:-}" ] && text=(--text "$TEXT")
  timeout -k 10 "$T" $PY experiments/speculative_decoding/spec_study.py --device cuda --dtype bfloat16 \
    --model-path "$M" --draft-path "$HEAD" "${text[@]}" \
    --modes "$mode" --contexts "$CONTEXT" --ks "$@" --concurrency "$n" --top-k "$TOP_K" \
    --steps "${STEPS:-16}" --warmup "${WARMUP:-6}" --spec-predict "$sp" --kv-budget-gb "${KV_GB:-3}" \
    "${SPEC_EXTRA[@]}" --out "$OUT/$NAME.jsonl" 2>&1 | grep -v -e Warning -e warn | tee -a "$OUT/$NAME.log" | tail -5
}
if [ "${SKIP_LOOK:-0}" != 1 ]; then
  SPEC_EXTRA=(--chained-k0 "${CHAINED:-8}")
  [ "${SPEC_CHAIN:-0}" -gt 1 ] && SPEC_EXTRA+=(--spec-chain "$SPEC_CHAIN")  # k = 1 chained too (ExecConfig.spec_chain)
  spec_run lookahead "${N_LOOK:-64}" after 0 1
  SPEC_EXTRA=()
  spec_run lookahead "${N_LOOK:-64}" beside 1
fi
SPEC_EXTRA=()
spec_run dense "$N_DENSE" after 0 1
say "done"
