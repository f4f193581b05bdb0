# Issue 17, "how much each byte saved buys": the fp8 (e4m3) host copy's UVA gather on more programs. At 16K x 44
# (critical_path_16k, a9d253e) the fp8 gather took 13.1 ms for 311 MB (24 GB/s) against bf16's 13.7 ms for 623 MB
# (45 GB/s): each program's iteration takes as long with half the bytes (latency-bound loads plus the integer
# dequantization), so the table's 16 programs move half the rate. Here: 16K x 44 and x 88 (the fp8 pool holds ~96)
# with the fp8 host copy on 16 (the table), 24, 32 and 48 programs, and the no-transfer twin at 44; decode chain 8.
# Not yet run (2026-12-02: the session's device time ran out). One H200 with a 128 GiB host; no vLLM needed.
#   OASIS_COMMIT=<sha> bash experiments/device.sh transfer_paths/fp8_programs   -> fp8_programs.jsonl, .log
# Prediction: 32 programs bring the 44-request fp8 step to ~15.5 ms (its no-transfer twin ~14.8), against 17.3 on 16.
DEADLINE_S=${DEADLINE_S:-400}
SYN=${SYN:-'{"preset": "smollm2"}'}
V=$(printf 'set=transfer:uva+uva_programs:%s,' 24 32 48); V=${V%,}
timeout -k 10 $(( $(left) - 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/fp8_programs.jsonl" --contexts 16k --dense-n none --la-n '16k=88,44' --max-n none --nt-n '16k=44' \
  --sens-n '16k=88,44' --variants "$V" --anchors none --exec host_kv_dtype=fp8_e4m3 --exec decode_chain=8 \
  --budget-s $(( $(left) - 30 )) --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/fp8_programs.log" | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/fp8_programs.md" 2>&1; cat "$OUT/fp8_programs.md"
say "done"
