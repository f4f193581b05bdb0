# The executor's first check on the GPU: gpu-marked tests (TESTS=1), oasis_kernels.bench (KBENCH=1), then one `bench`
# per line of a matrix file (each line = extra arguments; default matrix_check.txt, or matrix_measure.txt /
# matrix_max.txt beside it, or any path). Everything lands in $OUT; a summary table is printed last.
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/gpu_check [MATRIX]
TAG=${TAG:-check}; MATRIX=${1:-matrix_check.txt}
[ -f "$MATRIX" ] || MATRIX=experiments/dense_vs_lookahead_throughput/$MATRIX
if [ "${TESTS:-1}" = 1 ]; then
  FILES=${TEST_FILES:-"tests/integration/test_exec_engine.py tests/gpu/test_exec_gpu.py tests/gpu/test_policy_gpu.py \
    $(ls tests/*/test_kernels_*.py 2>/dev/null)"}
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider $FILES > "$OUT/exec_pytest_gpu.txt" 2>&1
  tail -4 "$OUT/exec_pytest_gpu.txt"
fi
if [ "${KBENCH:-0}" = 1 ] && [ -f oasis_kernels/bench.py ]; then
  timeout 150 python3 -m oasis_kernels.bench --out "$OUT/kernels_bench.json" > "$OUT/kernels_bench.log" 2>&1
fi
while read -r line; do
  [ -z "$line" ] && continue; case "$line" in \#*) continue;; esac
  timeout ${BENCH_TIMEOUT:-150} python3 -X faulthandler -m oasis_exec bench --model qwen3-8b --dummy --out "$OUT/exec_bench_$TAG.jsonl" \
    $line > /dev/null 2>> "$OUT/exec_bench_err.txt" || echo "FAILED: $line" | tee -a "$OUT/exec_bench_err.txt"
done < "$MATRIX"
python3 - "$OUT/exec_bench_$TAG.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    st = {k: round(v, 1) for k, v in r['stage_ms_per_step'].items()}
    print(f"{r['mode'][:5]:5s} {str(r['transfer'])[:4]:4s} nt={int(r['no_transfer'])} ctx={r['context']} n={r['concurrency']:3d} "
          f"tok/s={r['throughput_tok_s']:7.1f} p50={r['tpot_ms_p50']:6.2f} p99={r['tpot_ms_p99']:6.2f} "
          f"MB/st={r['bytes_moved_per_step']/1e6:6.1f} GB/s={r['transfer_gb_s'] and round(r['transfer_gb_s'],1)} "
          f"hid={r['hidden_fraction'] and round(r['hidden_fraction'],3)} {st}")
PY
grep -v "^\s*$" "$OUT/exec_bench_err.txt" 2>/dev/null | grep -i "error\|FAILED" | tail -8
