# Issue 17, call D (after call C, `decode_chain`, whose vLLM 16K x 16 and 32K x 10 runs hit their 100 s / 110 s
# timeouts): vLLM dense 16K x 16 and 32K x 10 and OasisKV lookahead (decode chain 8 and 1) at 16K x 44 and 32K x 22
# in one call, and the real model's GPU tests (cut off by call C's test timeout). Carry .vb/3 .models/b.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/decode_chain_b
DEADLINE_S=${DEADLINE_S:-560}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_run 32768 170 --ctx 32768 --conc 10 --kv-bytes 52e9
vllm_run 16384 160 --ctx 16384 --conc 16 --kv-bytes 52e9
B=$(( $(left) - 100 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44;32k=22' --max-n none \
  --nt-n none --sens-n '16k=44;32k=22' --variants set=decode_chain:1 --anchors none \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
need_model && TEST_S=$(( $(left) - 10 )) gpu_tests tests/gpu/test_real_model_gpu.py
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -10
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
