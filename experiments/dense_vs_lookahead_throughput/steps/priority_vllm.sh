# Issue 17: the side streams' priorities against the step (oasis_exec.config.STREAM_PRIORITIES) with vLLM dense in
# the same call. priority_ab (fd776ce) found low (both side streams below the step) cut the no-transfer 16K x 44 step
# from 14.84 to 13.78 ms (the step no longer waits for SMs the prediction holds) but starved the copy (17.49 -> 20.33
# ms with transfers). Here: pred_low (the prediction below, the copy level with the step) and pred_low_copy_high (the
# copy above it), against the table's normal, at 16K x 44, 16K x 16 and 32K x 22, each with no-transfer twins;
# vLLM dense 16K x 16 and 32K x 10. Carry .vb/3 .models/b after `stash` of .vb/1 .vb/2 .models/a .models/c.
# Prediction: pred_low ~16.5 ms at 16K x 44 (from 17.5), ~10.3 at x 16 (from 10.65): 2.4x vLLM at 16K, 3.3x at 32K.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/priority_vllm
DEADLINE_S=${DEADLINE_S:-565}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_run 16384 160 --ctx 16384 --conc 16 --kv-bytes 52e9
vllm_run 32768 170 --ctx 32768 --conc 10 --kv-bytes 52e9
B=$(( $(left) - 15 ))
say "OasisKV (budget ${B}s)"
V='set=stream_priority:pred_low,set=stream_priority:pred_low_copy_high,set=no_transfer:true+stream_priority:pred_low'
V="$V,set=stream_priority:low"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16;32k=22' --sens-n '16k=44,16;32k=22' --variants "$V" --anchors none \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
tail -n +1 "$OUT"/vllm_*.log > "$OUT/vllm.log" 2>&1 && rm -f "$OUT"/vllm_*.log  # 8 files come back
say "done"
