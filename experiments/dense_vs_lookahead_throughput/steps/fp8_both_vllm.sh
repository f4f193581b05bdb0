# Issue 17, figure 1 with fp8 on both sides, in one call (until now across calls: vLLM fp8 1,615.1 tok/s at 42 in
# baselines_3ca3b31, OasisKV's fp8 host copy 2,569.3 at 96 in baselines_more_8e1c817, 1.59x, both before the marks
# and the default victim cache). Here: vLLM dense at 16K with bf16 KV (16) and fp8 e4m3 KV (42, its most at 52 GB);
# OasisKV lookahead at the engine's defaults with the bf16 host copy at 48 (S = 3K: 48 lanes fit the budget) and
# the fp8 host copy (host_kv_dtype=fp8_e4m3) at 96 (S = K: 96 lanes of 3K do not fit) and 48 (S = 3K), in a second
# process (the host copy's dtype sizes a process's one pool; the first process's pool is gone when it exits).
# Dummy Qwen3-8B on both sides, synthetic smollm2 selection with a model-selected step's work. Carry .vb/3 after
# `stash` of .vb/1 and .vb/2 (vllm_setup.sh), back to back.
# Prediction: bf16 48 ~14.1 ms (3.1x vLLM bf16); fp8 at 48 ~14 ms, at 96 ~33 ms (~2,900 tok/s, ~1.8x vLLM fp8).
# Ran 2026-12-02 16:11 UTC at 6fa88eb: results/fp8_both_vllm_6fa88eb/.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/fp8_both_vllm
DEADLINE_S=${DEADLINE_S:-590}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_unpack
vllm_run 16384 150 --ctx 16384 --conc 16 --kv-bytes 52e9
vllm_run 16384_fp8 150 --ctx 16384 --conc 42 --kv-bytes 52e9 --kv-cache-dtype fp8
la() {  # OUT_NAME LA_N BUDGET_S [--exec ...]: one h200_headline process (host_kv_dtype sizes its one pool)
  local name=$1 n=$2 b=$3; shift 3
  say "OasisKV $name $n (budget ${b}s)"
  timeout -k 10 $(( b + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
    --out "$OUT/$name.jsonl" --contexts 16k --dense-n none --la-n "$n" --max-n none --nt-n none --sens-n none \
    --anchors none --synthetic-work model --exec decode_chain=8 --exec topk_kernel=fused --budget-s "$b" --steps 24 \
    --warmup 4 --synthetic "$SYN" "$@" 2>&1 | grep -v " plan " | tee "$OUT/$name.log" | grep -E "done|skip|FAIL|fail|rror"
}
la oasis '16k=48' $(( ($(left) - 30) / 2 ))
la oasis_fp8 '16k=96,48' $(( $(left) - 25 )) --exec host_kv_dtype=fp8_e4m3
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
tail -n +1 "$OUT"/vllm_*.log > "$OUT/vllm.log" 2>&1 && rm -f "$OUT"/vllm_*.log
say "done"
pack_out baselines.md progress.log oasis.jsonl oasis_fp8.jsonl
