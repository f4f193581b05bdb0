# Issue 17, overlap and the 16K step: the side streams below the step (stream_priority=low: graphs captured at
# priority -1, the prediction and copy streams at 0) against the table's choice (normal at 16 and 44), lookahead and
# its no-transfer twin at 16K x 16 and x 44, decode chain 8; then the 16K x 44 profile with low (critical_path.py).
# critical_path_16k (a9d253e) found the main stream idle 1.2 ms (16) and 2.8-3.3 ms (44) a step inside its graph,
# most gaps ending with no side kernel ending: the step's kernels waiting for SMs the side streams hold?
# Prediction: low cuts up to ~1-2 ms at 44 and ~0.5-1 ms at 16 from both twins; the risk is the copy at 44 becoming
# the graph's tail.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/priority_ab
DEADLINE_S=${DEADLINE_S:-560}
SYN=${SYN:-'{"preset": "smollm2"}'}
B=$(( $(left) - 150 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k --dense-n none --la-n '16k=44,16' --max-n none --nt-n '16k=44,16' \
  --sens-n '16k=44,16' --variants 'set=stream_priority:low,set=no_transfer:true+stream_priority:low' --anchors none \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
T=$(min 130 $(( $(left) - 80 )))
if [ "$T" -ge 60 ]; then
  say "profile la16k44 low"
  timeout -k 5 "$T" $PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" \
    --top 30 --steps 2 --mode lookahead --context 16384 --concurrency 44 --stream-priority low \
    --trace-out /tmp/low44.json.gz --out "$OUT/profile_low44.jsonl" > "$OUT/profile_low44.txt" 2>&1 \
    && $PY experiments/decode_step_profile/critical_path.py /tmp/low44.json.gz >> "$OUT/profile_low44.txt" 2>&1
fi
TEST_S=$(min 90 $(( $(left) - 5 ))) gpu_tests tests/gpu/test_exec_gpu.py -k low
say "done"
