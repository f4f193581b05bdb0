#!/usr/bin/env bash
# Build check on the GPU machine: gpu-marked tests, then `bench` in every mode at a small scale.
# Usage (device tool): bash oasis_exec/gpu_check.sh ; everything lands in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
CTX=${CTX:-4096}; N=${N:-8}; STEPS=${STEPS:-16}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/exec_device.txt" 2>&1
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/exec_pytest_gpu.txt" 2>&1
tail -5 "$OUT/exec_pytest_gpu.txt"
if [ -f kernels/bench.py ]; then timeout 120 python3 -m kernels.bench --out "$OUT/kernels_bench.json" > "$OUT/kernels_bench.log" 2>&1; fi
B="python3 -m oasis_exec bench --model qwen3-8b --dummy --context $CTX --concurrency $N --steps $STEPS --warmup 4 \
   --max-lanes $N --kv-budget-gb 40 --host-kv-gb 6 --selection synthetic --profile --out $OUT/exec_bench_check.jsonl"
for m in dense quest retrieval proxy lookahead; do
  timeout 150 $B --mode $m > /dev/null 2>> "$OUT/exec_bench_err.txt" || echo "bench $m failed" | tee -a "$OUT/exec_bench_err.txt"
done
timeout 150 $B --mode lookahead --transfer uva > /dev/null 2>> "$OUT/exec_bench_err.txt" || echo "bench uva failed" | tee -a "$OUT/exec_bench_err.txt"
python3 - "$OUT/exec_bench_check.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['mode']:10s} {str(r['transfer']):5s} n={r['concurrency']:3d} tok/s={r['throughput_tok_s']:8.1f} "
          f"p50={r['tpot_ms_p50']:7.2f} p99={r['tpot_ms_p99']:7.2f} MB/step={r['bytes_moved_per_step']/1e6:7.1f} "
          f"hidden={r['hidden_fraction']} stages={ {k: round(v, 2) for k, v in r['stage_ms_per_step'].items()} }")
PY
tail -20 "$OUT/exec_bench_err.txt" 2>/dev/null
