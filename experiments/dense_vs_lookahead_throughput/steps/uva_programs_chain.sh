# Issue 17, overlap: the UVA gather's program count with decode chain 8 (the table, oasis_exec/transfer/table.json,
# chose 8 at 16 requests and 16 at 48 from chain-1 steps at 7e41f72), at 16K x 16 and x 44, with the no-transfer twins;
# then tests/gpu/test_exec_gpu.py at this commit. traces_16 (319a24f) put the 16-request overlap cost spread over the
# layers (+11 us a layer, 259 against 248 us): the copy kernel's share of the SMs.
# Prediction: 4 programs too slow at 16 (a tail); 12-16 no better than 8; at 44, 24-32 programs no better than 16.
#   OASIS_COMMIT=<sha> [NS='16k=16'] [TESTS=0] bash experiments/device.sh dense_vs_lookahead_throughput/uva_programs_chain
# (d7f3e32's run crashed at the first variant, a duplicate transfer keyword, fixed in 2628eea; it ran the base runs and
# the GPU tests. A re-run with NS='16k=16' TESTS=0 found too little device time to start; transfer_paths/steps/
# gather_launch_chain.sh asks the same with the items per iteration added.)
NS=${NS:-'16k=44,16'}
DEADLINE_S=${DEADLINE_S:-400}
SYN=${SYN:-'{"preset": "smollm2"}'}
V=$(printf 'set=transfer:uva+uva_programs:%s,' 4 12 16 24 32); V=${V%,}
timeout -k 10 200 $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k --dense-n none --la-n "$NS" --max-n none --nt-n "$NS" \
  --sens-n "$NS" --variants "$V" --anchors none --exec decode_chain=8 --budget-s 190 --steps 24 --warmup 4 \
  --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
if [ "${TESTS:-1}" = 1 ]; then
  TEST_S=$(( $(left) - 5 )) gpu_tests tests/gpu/test_exec_gpu.py
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -10
fi
say "done"
