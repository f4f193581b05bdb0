# Issue 17: the UVA gather's launch shape in the decode-chain step (chain 8), two questions, one call. Written
# 2026-12-02 when a session's device time ran out; widened and run at f143ed3 (results/gather_launch_chain_f143ed3/,
# with --transfer uva and the live generator, h200_headline's defaults then). One H200, 128 GiB host; no vLLM.
# 1. Overlap at 16 requests (1.100 at 2270bc3). The copies add 11-20 us to every layer, with no tail
#    (decode_step_profile/results/traces_16_319a24f): the gather's share of the SMs. The table runs 8 programs x 2
#    items. Fewer programs with more items in flight (ExecConfig.uva_items_per_iter) might keep the 23 GB/s the
#    step needs on fewer SMs: 4x4, 4x8, 2x8, 8x4, 16x2 at 16K x 16, and 16x4, 8x8 at x 44, beside the no-transfer twins.
# 2. The fp8 host copy's per-program rate. At 16K x 44 its gather moved 24 GB/s against bf16's 45 on the same 16
#    programs (decode_step_profile/results/critical_path_16k_a9d253e). Its items are half the bytes, so 16 programs
#    keep half the bytes in flight. fp8 (--exec host_kv_dtype=fp8_e4m3, its own pool) at 16K x 88 and x 44 on
#    16x2 (the table), 16x4, 32x2 and 32x4, with the no-transfer twin at 44.
# Predictions: (1) 4x4 or 4x8 brings 16 requests to ~1.06; (2) 16x4 or 32x2 brings the fp8 step at 44 to ~15.5 ms
# (17.3 on 16x2).
#   OASIS_COMMIT=<sha> bash experiments/device.sh transfer_paths/gather_launch_chain   -> bf16.jsonl, fp8.jsonl, *.md
DEADLINE_S=${DEADLINE_S:-540}
SYN=${SYN:-'{"preset": "smollm2"}'}
v() { local out="" pi; for pi in "$@"; do out+="set=transfer:uva+uva_programs:${pi%x*}+uva_items_per_iter:${pi#*x},"; done; echo "${out%,}"; }
sweep() {  # NAME NS VARIANTS [ARGS...] -> $OUT/NAME/NAME.jsonl, $OUT/NAME.log, $OUT/NAME.md (baselines_table)
  local name=$1 ns=$2 vs=$3; shift 3
  say "$name: $ns"
  mkdir -p "$OUT/$name"
  timeout -k 10 $(( $(left) - 20 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
    --out "$OUT/$name/$name.jsonl" --contexts 16k --dense-n none --la-n "$ns" --max-n none --nt-n "$NT" \
    --sens-n "$ns" --variants "$vs" --anchors none --exec decode_chain=8 --budget-s $(( $(left) - 40 )) --steps 24 \
    --warmup 4 --synthetic "$SYN" "$@" 2>&1 | grep -v " plan " | tee "$OUT/$name.log" | grep -E "done|skip|fail|error"
  $PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT/$name" > "$OUT/$name.md" 2>&1
  cat "$OUT/$name.md"
}
# Every variant runs at both concurrencies (one process pins the pool once; a run takes 3-6 s), each point beside its
# own no-transfer twin of the same call.
NT='16k=44,16' DEADLINE_S=300 sweep bf16 '16k=44,16' "$(v 4x4 4x8 2x8 8x4 16x2 16x4 8x8 32x2 32x4)"
NT='16k=44' sweep fp8 '16k=88,44' "$(v 16x4 32x2 32x4 8x8)" --exec host_kv_dtype=fp8_e4m3
say "done"
