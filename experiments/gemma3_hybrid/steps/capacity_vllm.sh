# Issue 36: the capacity story on real weights -- Gemma 3 270M at 32K, one 3 GB KV budget, in one call: vLLM 0.26
# dense on the same GGUF (its hybrid allocator keeps the sliding windows) against OasisKV dense (rings for the 15
# sliding layers, pages for the 3 full ones) and lookahead at K = 128 and 256 blocks, S = K (--hot-slots K) and the
# engine's victim cache (S = 3K where it fits), plus the no-transfer twin of each lookahead run. Selection: the
# model's own (--selection model); weights: real. Bench records (tok/s, TPOT, bytes a step) in $OUT/oasis.jsonl.
# Carry the model's pieces (.models/a .. .models/h, `stash`ed back to back, see greedy_long.sh) and the vLLM bundle
# (.vb/1 .. .vb/3: dense_vs_lookahead_throughput/vllm_setup.sh), then:
#   OASIS_COMMIT=<sha> MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
#     bash experiments/device.sh gemma3_hybrid/capacity_vllm
# Written, not yet run (no device time in this session). Expected lanes at 32,000 tokens and 3 GB (bf16): dense
# ~29 (100 MB of full-layer pages + 7.9 MB of rings a lane); lookahead K = 128, S = K: a lane's GPU share is
# 3 layers x (K + 2) x 4 KiB x 2 + the rings + summaries, so the host pool and the step time bound it, not the budget.
DEADLINE_S=${DEADLINE_S:-590}
CTX=${CTX:-32000}
BUDGET=${BUDGET:-3}
need_model || exit 1
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_run gemma 200 --gguf "$M" --ctx "$CTX" --conc "${VLLM_CONC:-16,32}" --kv-bytes "${BUDGET}e9"
run() {  # NAME BENCH-ARGS...: one bench record into $OUT/oasis.jsonl
  local name=$1; shift
  say "OasisKV $name: $*"
  timeout -k 10 "$(min 150 "$(( $(left) - 20 ))")" $PY -m oasis_exec bench --model-path "$M" --device cuda \
    --context "$CTX" --kv-budget-gb "$BUDGET" --concurrency "${N:-128}" --steps "${STEPS:-24}" --warmup 4 \
    --selection model "$@" --out "$OUT/oasis.jsonl" > "$OUT/bench_$name.log" 2>&1 \
    || say "$name failed: $(tail -2 "$OUT/bench_$name.log" | cut -c1-300)"
}
run dense --mode dense
for K in 128 256; do
  run "la${K}_s" --mode lookahead --top-k "$K" --hot-slots "$K"
  run "la${K}_victim" --mode lookahead --top-k "$K"
  run "la${K}_s_nt" --mode lookahead --top-k "$K" --hot-slots "$K" --no-transfer
done
tail -n +1 "$OUT"/bench_*.log > "$OUT/bench.log" 2>&1 && rm -f "$OUT"/bench_*.log
say "done"
pack_out progress.log oasis.jsonl vllm_gemma.json
