# Shared preamble of the one-call H200 scripts (h200_final.sh, simulator_vs_executor/steps/record_matrix.sh, serving_load/steps/serve.sh); source it after
# setting DEADLINE_S (seconds the whole script may take). Gives OUT, PY, PYTHONPATH/OASIS_COMMIT exported, and:
#   el (seconds since start), left (seconds to DEADLINE_S), say MSG (timestamped line to stdout and
#   $OUT/progress.log), min A B, device_info (GPU, memory, torch/triton versions into $OUT/device.txt), and
#   table_from RUNS.jsonl PREFIX (transfer_paths.py's summary into the engine's oasis_exec/transfer_table.json, on
#   the device, and a copy into $OUT).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OASIS_COMMIT=${OASIS_COMMIT:-unknown}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}  # one GPU, also on a lent machine with several
PY=${PY:-python3}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE_S - $(el) )); }
say() { echo "[$(date -u +%H:%M:%S) +$(el)s] $*" | tee -a "$OUT/progress.log"; }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }
device_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
  free -g >> "$OUT/device.txt" 2>&1
  grep -E 'MemTotal|MemAvailable' /proc/meminfo >> "$OUT/device.txt" 2>&1
  $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/device.txt" 2>&1
  cat "$OUT/device.txt"
}
table_from() {
  $PY experiments/transfer_paths/transfer_paths.py --summarize "$1" "$2" --table-out oasis_exec/transfer_table.json 2>&1 | tail -2
  cp oasis_exec/transfer_table.json "$OUT/transfer_table.json"
}
