# Measure the host-gather + DMA path captured in CUDA graphs (09060ff, written CPU-only),
# let the measurement pick the engine's transfer table, and re-run the 16K headline points with it. On a 256 GiB
# host (kind nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh transfer_paths/host_path_in_graphs
# 1. pytest -m gpu: the graph-mode host path (graph == eager, slots == host pool) and the executor   -> pytest_gpu.txt
# 2. transfer_paths.py at 64/32/8: uva 8/16 (graph) against host 16 threads (graph and eager), each with the side
#    streams at normal and at high CUDA priority                                                    -> transfer_paths.jsonl
# 3. its summary on the device: the choice table the engine reads (oasis_exec/transfer/table.json) -> transfer_table.json
# 4. h200_headline.py: dense at 21 and lookahead at 16/40/48/56 (+ no-transfer at 16) with transfer=auto,
#    i.e. with the table just measured                                                         -> headline.jsonl
# Progress lines with timestamps go to stdout and $OUT/progress.log. Step 4 runs even if the host path failed (the
# table then holds the UVA choices again).
DEADLINE_S=${DEADLINE_S:-560}


T1=$(min 120 $(( $(left) - 400 )))
say "1. pytest -m gpu (timeout ${T1}s)"
TEST_S=$T1 gpu_tests tests/gpu/test_exec_gpu.py tests/unit/test_kernels_gather.py

B=$(min 240 $(( $(left) - 200 )))
say "2. transfer_paths (budget ${B}s)"
timeout -k 10 $(( B + 30 )) $PY -X faulthandler experiments/transfer_paths/transfer_paths.py --out "$OUT/transfer_paths.jsonl" \
  --budget-s "$B" --concurrency 64,32,8 --programs 8,16 --threads 16 --priorities normal,high --steps 12 --warmup 3 \
  2>&1 \
  | tee "$OUT/transfer_paths.log"
say "2. rc=${PIPESTATUS[0]}"

say "3. summary -> oasis_exec/transfer/table.json"
table_from "$OUT/transfer_paths.jsonl" "$OUT/transfer_paths"

B=$(( $(left) - 15 ))
if [ "$B" -gt 40 ]; then
  say "4. headline with the new table (budget ${B}s)"
  timeout -k 10 $(( B + 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py --out "$OUT/headline.jsonl" \
    --contexts 16k --dense-n 21 --la-n '16k=16,40,48,56' --max-n none --nt-n '16k=16' --sens-n none \
    --anchors none --transfer auto --budget-s "$B" 2>&1 | grep -v "plan " | tee "$OUT/headline.log"
else
  say "4. no time left for the headline"
fi
say "done"
