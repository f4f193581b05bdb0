# After a change to the executor: the GPU tests, then dense at its 52 GB maximum (21 requests) and lookahead at 32 with
# its no-transfer twin, at 16K, on ONE H200 (128 GiB host: the 32-request pool is 77.5 GB). Compare with the latest
# headline (results/headline_52gb.md) and the single-H200 figures of results/recheck_16k.md. The real-model GPU tests
# run when the model's pieces were stashed by earlier calls (device.sh stash), else they skip.
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/recheck_16k    -> recheck_16k.jsonl, .log
DEADLINE_S=${DEADLINE_S:-540}

need_model || say "no real model: its GPU tests skip"
gpu_tests
B=$(( $(left) - 15 ))
say "recheck (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/recheck_16k.jsonl" --contexts 16k --dense-n '16k=21' --la-n '16k=32' --max-n none --nt-n '16k=32' \
  --sens-n none --anchors none --transfer auto --budget-s "$B" 2>&1 | grep -v " plan " | tee "$OUT/recheck_16k.log"
say "done"
