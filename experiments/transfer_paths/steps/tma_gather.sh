# The GPU tests, the experimental TMA gather beside the thread-load gather
# (alone, beside a GEMM load, and inside the step), then the 52 GB headline at 16K and 32K with the engine's table.
# On a 256 GiB host (kind nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh transfer_paths/tma_gather
# 1. pytest -m gpu (the files that have GPU tests) + the gather kernel tests natively                                -> pytest_gpu.txt
# 2. uva_gather_variants.py --kernel uva,tma                                                -> gather_variants.json
# 3. transfer_paths.py at 64/48: uva16 thread loads vs TMA (copies in the step's graph)     -> transfer_paths.jsonl
# 4. h200_headline.py: 16K dense 21/24, lookahead 16/48/64 (+ no-transfer twins); 32K dense 10, lookahead 44
#                                                                                           -> headline.jsonl
DEADLINE_S=${DEADLINE_S:-565}

say "1. pytest"
gpu_tests  # the files with GPU tests (the simulator's tests need simpy, which the device lacks)
timeout -k 5 60 $PY -m pytest -q -p no:cacheprovider tests/unit/test_kernels_gather.py tests/unit/test_kernels_gather_tma.py \
  >> "$OUT/pytest_gpu.txt" 2>&1
say "1b. gather kernel tests rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"

say "2. gather variants"
timeout -k 5 90 $PY experiments/transfer_paths/uva_gather_variants.py --out "$OUT/gather_variants.json" --kernel uva,tma \
  --programs 8,16,32 --ipi 2 --warps 4 --stages 2,4 --tma-warps 1,4 2>&1 | tail -20
say "2. rc=${PIPESTATUS[0]}"

B=$(min 150 $(( $(left) - 230 )))
say "3. transfer_paths tma (budget ${B}s)"
timeout -k 10 $(( B + 30 )) $PY -X faulthandler experiments/transfer_paths/transfer_paths.py --out "$OUT/transfer_paths.jsonl" \
  --budget-s "$B" --concurrency 64,48 --programs 16,32 --threads '' --uva-kernels loads,tma --in-graph \
  --steps 12 --warmup 3 2>&1 | grep -E "done|FAIL|budget" | grep -v -- "-graph .*-graph" | cut -c1-150
say "3. rc=${PIPESTATUS[0]}"

B=$(( $(left) - 10 ))
say "4. headline (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py --out "$OUT/headline.jsonl" \
  --contexts 16k,32k --dense-n '16k=21,24;32k=10' --la-n '16k=16,48,64;32k=44' --max-n none \
  --nt-n '16k=16,48,64' --sens-n none --anchors none --transfer auto --budget-s "$B" 2>&1 | grep -v " plan " \
  | tee "$OUT/headline.log"
say "done"
