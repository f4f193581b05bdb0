# Issue 17: the fp8 host copy's gather, items an iteration. gather_launch_chain (f143ed3) ran the fp8 pool on 32
# programs x 2 items (the headline's old uva default), 16x4, 32x2, 32x4, 8x8 at 16K x 44 and x 88, once each: 4 items
# were 1.9% (44) and 4.3% (88) faster than 2 on 16 or 32 programs, within about two runs' noise. ExecConfig's
# uva_items_per_iter default is now 4 for an fp8 copy (16 KiB in flight a program, as bf16's 2). Here, each point
# twice, with the engine's own choice (transfer auto: the table's programs) against 2 items, and 32 programs with
# either, beside no-transfer twins; then the GPU tests of tests/gpu/test_exec_gpu.py (after `stash` in this call).
# Prediction: 4 items 2-4% faster than 2 at 88, within noise at 44.
#   OASIS_COMMIT=<sha> bash experiments/device.sh transfer_paths/fp8_items   -> fp8_items.jsonl, fp8_items.md, pytest_gpu.txt
DEADLINE_S=${DEADLINE_S:-420}
SYN=${SYN:-'{"preset": "smollm2"}'}
V='set=transfer:auto,set=uva_items_per_iter:2,set=uva_items_per_iter:2+transfer:auto'
V="$V,set=transfer:uva+uva_programs:32,set=transfer:uva+uva_programs:32+uva_items_per_iter:2"
say "fp8: 16k=88,44"
timeout -k 10 200 $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/fp8_items.jsonl" --contexts 16k --dense-n none --la-n '16k=88,44' --max-n none --nt-n '16k=88,44' \
  --sens-n '16k=88,44' --variants "$V" --anchors none --exec decode_chain=8 --exec host_kv_dtype=fp8_e4m3 \
  --budget-s 180 --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/fp8_items.log" \
  | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/fp8_items.md" 2>&1; cat "$OUT/fp8_items.md"
TEST_S=$(min 200 $(( $(left) - 10 ))) gpu_tests tests/gpu/test_exec_gpu.py
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -20
say "done"
