# The host path with the native (C, GIL-free) gather (oasis_kernels/host_native.py) and the
# persistent scatter against UVA inside the real step. On a 256 GiB host (kind nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh transfer_paths/native_host_gather
# 1. the native gather's tests + the GPU tests of the host path (graph == eager, slots == host pool)  -> pytest_gpu.txt
# 2. oasis_kernels.bench_host_gather: torch vs native gather alone and beside a launching thread, 8/16/24
#    threads, at the per-layer sizes of 8 and 64 requests (384 and 3,072 items)                    -> host_gather.json
# 3. transfer_paths.py at $CONC (64,32): uva16 (copies in the step's graph, as the table) against the native host
#    gather on $THREADS (16,24) threads, under $SWITCH_US (0,200) us switch intervals, side streams at $PRIOS
#    (normal) priority                                                                              -> transfer_paths.jsonl
#    (GATHER_BENCH=0 skips step 2. The defaults ran at 20deb16; at e169888 also a persistent scatter on
#    0 (one program per block) / 16 / 64 programs: no gain, removed, ../results/persistent_scatter_in_step.md)
# 4. its summary and choice table (on the device; committed only if it is adopted)                  -> transfer_table.json
DEADLINE_S=${DEADLINE_S:-565}
export OASIS_CACHE_DIR=${OASIS_CACHE_DIR:-/tmp/oasis-cache}

{ nproc; lscpu 2>&1 | grep -E "Model name|Socket|NUMA|Thread|Core|L3"; } >> "$OUT/device.txt" 2>&1
$PY -c "from oasis_kernels import host_native as h; print(\"native gather openmp:\", h.openmp())" >> "$OUT/device.txt" 2>&1
tail -10 "$OUT/device.txt"

say "1. pytest (native gather + host path GPU tests)"
timeout -k 5 120 $PY -m pytest -q -p no:cacheprovider tests/unit/test_kernels_host_native.py tests/unit/test_kernels_gather.py \
  "tests/gpu/test_exec_gpu.py::test_host_path_in_graphs_equals_eager" \
  "tests/gpu/test_exec_gpu.py::test_host_path_in_graphs_mapping_matches_slots" > "$OUT/pytest_gpu.txt" 2>&1
say "1. rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"

if [ "${GATHER_BENCH:-1}" = 1 ]; then
say "2. host gather alone"
timeout -k 5 90 $PY -m oasis_kernels.bench_host_gather --threads 8 16 24 --blocks 384 3072 --impls flat native \
  --conditions idle launcher --pool-gb 8 --min-s 0.3 --out "$OUT/host_gather.json" 2>&1 | tail -24
say "2. rc=${PIPESTATUS[0]}"
fi

B=$(( $(left) - 25 ))
say "3. transfer_paths (budget ${B}s)"
timeout -k 10 $(( B + 15 )) $PY -X faulthandler experiments/transfer_paths/transfer_paths.py --out "$OUT/transfer_paths.jsonl" \
  --budget-s "$B" --concurrency ${CONC:-64,32} --programs 16 --in-graph --threads ${THREADS:-16,24} \
  --host-kernels native --switch-us ${SWITCH_US:-0,200} \
  --priorities ${PRIOS:-normal} --steps 12 --warmup 3 2>&1 | grep -E "done|FAIL|budget|runs to do" | cut -c1-170
say "3. rc=${PIPESTATUS[0]}"

say "4. summary"
table_from "$OUT/transfer_paths.jsonl" "$OUT/transfer_paths"
cp "$OUT/transfer_paths.md" "$OUT/transfer_paths_summary.md" 2>/dev/null
say "done"
