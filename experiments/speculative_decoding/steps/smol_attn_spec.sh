# Issue 40's SmolLM2 row with the long-context attention head (heads/smollm2-attn-8k, trained on 384 windows of
# 8,192 tokens; speculates at k = 1 only): real weights, the model's own selection and acceptance, CONTEXT (7800)
# tokens of traces/texts/argparse.py.txt, K = TOP_K (64) blocks, the same GPU KV budget for every run (KV_GB, 3 GB),
# after the model's pieces are stashed (MODEL_DIR) or carried:
#   MODEL_DIR=/tmp/ms OASIS_COMMIT=<sha> bash experiments/device.sh speculative_decoding/smol_attn_spec
# lookahead k = 0, 1 after (one prefill) and k = 0 with decode chains of CHAINED (8) steps on an engine of its own
# (the table's baseline), lookahead k = 1 beside, dense k = 0, 1           -> $OUT/smol_attn.jsonl, smol_attn.md
# (the single-key head's table at the same settings: pipelined.sh, results/h100_*/ and h200_*/)
DEADLINE_S=${DEADLINE_S:-560}
need_model || exit 1
run() {  # MODE N SPEC_PREDICT KS...
  local mode=$1 n=$2 sp=$3; shift 3
  local T; T=$(min $(( $(left) - 10 )) ${RUN_S:-120})
  [ "$T" -lt 30 ] && { say "no time left for $mode $sp"; return; }
  say "$mode $sp k=$* (left $(left)s)"
  # shellcheck disable=SC2086
  timeout -k 10 "$T" $PY experiments/speculative_decoding/spec_study.py --device cuda --dtype bfloat16 \
    --model-path "$M" --draft-path "${HEAD:-experiments/long_context_draft/heads/smollm2-attn-8k}" \
    --modes "$mode" --contexts "${CONTEXT:-7800}" --ks "$@" --concurrency "$n" --top-k "${TOP_K:-64}" \
    --steps "${STEPS:-16}" --warmup "${WARMUP:-6}" --spec-predict "$sp" --kv-budget-gb "${KV_GB:-3}" \
    "${EXTRA[@]}" --out "$OUT/smol_attn.jsonl" 2>&1 | grep -v -e Warning -e warn | tee -a "$OUT/smol_attn.log" | tail -5
}
EXTRA=(--chained-k0 "${CHAINED:-8}")
run lookahead "${N_LOOK:-64}" after 0 1
EXTRA=()
run lookahead "${N_LOOK:-64}" beside 1
run dense "${N_DENSE:-16}" after 0 1
say "done"
