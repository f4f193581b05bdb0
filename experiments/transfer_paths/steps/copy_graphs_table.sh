# UVA copies as graphs of their own (copy_graph: a layer's copy may run past its step's end, until that layer
# of the next step) and side-stream priority, measured in the real step; the engine's table rewritten from it; the
# 16K headline re-run with it (results/copy_graphs_table.md: the engine's current table). On a 256 GiB host (kind nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh transfer_paths/copy_graphs_table
# 1. pytest -m gpu: copy graphs == copies in the step's graph, slots == host pool (and the rest)     -> pytest_gpu.txt
# 2. transfer_paths.py at 64/48/32/16/8: uva 8/16, normal/high priority, copy graph / in the step's graph (-ig)
#    (the host path lost 2-3x in the previous call, exec_h200_transfer_paths_prio_2026-11-30)        -> transfer_paths.jsonl
# 3. its summary on the device: the engine's choice table                                          -> transfer_table.json
# 4. h200_headline.py at 16K: dense at 18/21/24 and lookahead at 16/40/48/56/64 (+ no-transfer at 16/64) with
#    transfer=auto, i.e. the table just measured                                                    -> headline.jsonl
DEADLINE_S=${DEADLINE_S:-560}


say "1. pytest -m gpu"
TEST_S=150 gpu_tests tests/gpu/test_exec_gpu.py tests/unit/test_kernels_gather.py

B=$(min 240 $(( $(left) - 170 )))
say "2. transfer_paths (budget ${B}s)"
timeout -k 10 $(( B + 30 )) $PY -X faulthandler experiments/transfer_paths/transfer_paths.py --out "$OUT/transfer_paths.jsonl" \
  --budget-s "$B" --concurrency 64,48,32,16,8 --programs 8,16 --threads '' --priorities normal,high --in-graph \
  --steps 12 --warmup 3 2>&1 | grep -v " plan " | tee "$OUT/transfer_paths.log"
say "2. rc=${PIPESTATUS[0]}"

say "3. summary -> oasis_exec/transfer/table.json"
table_from "$OUT/transfer_paths.jsonl" /tmp/transfer_paths

B=$(( $(left) - 15 ))
if [ "$B" -gt 40 ]; then
  say "4. headline with the new table (budget ${B}s)"
  timeout -k 10 $(( B + 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py --out "$OUT/headline.jsonl" \
    --contexts 16k --dense-n 18,21,24 --la-n '16k=16,40,48,56,64' --max-n none --nt-n '16k=16,64' --sens-n none \
    --anchors none --transfer auto --budget-s "$B" 2>&1 | grep -v " plan " | tee "$OUT/headline.log"
else
  say "4. no time left for the headline"
fi
say "done"
