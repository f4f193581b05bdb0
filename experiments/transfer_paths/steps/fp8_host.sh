# Issue 17, "fewer bytes per step": the fp8 (e4m3) host copy of K and V (ExecConfig.host_kv_dtype=fp8_e4m3,
# oasis_exec/kv/host_quant.py: per-(block, head) scales, dequantized in the UVA gather; the GPU slots stay bf16) against
# the bf16 host copy, in the real step at 16K x 32 (52 GB budget, synthetic selection with the smollm2 preset,
# pool not filled), each with its no-transfer twin; then the most 16K requests the host's memory holds with fp8.
# On ONE H200 with a 128 GiB host (kind nvidia-h200: the bf16 pool of 32 x 16K is 77.5 GB, the fp8 one 38.9 GB):
#   OASIS_COMMIT=<hash> bash experiments/device.sh transfer_paths/fp8_host
# 1. pytest -m gpu, the fp8 tests: kernels == torch reference on the GPU, graphs == eager, slots == dequantized
#    host copies (uva, host torch/native, retrieval, hisparse)                                     -> pytest_gpu.txt
# 2. bench at 16K x 32: host_kv_dtype auto / fp8_e4m3, each with --no-transfer                     -> fp8_host.jsonl
# 3. the most requests at 16K the host pool check admits, bf16 and fp8 (POOL_SHARE of MemAvailable); the fp8
#    bench at one more (the check refuses it before pinning: its message in the log) and at that most -> fp8_max.jsonl
#    (on the 128 GiB host about 90 fp8 requests, below the ~110 lanes of the 52 GB budget; where the GPU lanes bind
#    first, e.g. on a 256 GiB host, the step says so and skips these runs)
# 4. the table: bytes/step, TPOT p50/p99, tok/s, host pool GB, transfer GB/s, hidden fraction        -> fp8_host.md
# Estimate ~330 s: pinning 77.5 GB twice (~30 s each at ~2.7 GB/s), 38.9 GB twice, ~100 GB once, the GPU tests ~90 s.
DEADLINE_S=${DEADLINE_S:-560}
CTX=${CTX:-16384}
N=${N:-32}
BENCH=(-m oasis_exec bench --mode lookahead --context "$CTX" --kv-budget-gb 52 --selection synthetic
  --synthetic '{"preset":"smollm2"}' --no-host-fill --transfer auto --top-k 128 --steps 32 --warmup 5)
export OASIS_CACHE_DIR=${OASIS_CACHE_DIR:-/tmp/oasis-cache}
grep -E "MemTotal|MemAvailable" /proc/meminfo | tee -a "$OUT/device.txt"

say "1. pytest -m gpu (fp8 host copy)"
timeout -k 5 "${TEST_S:-150}" $PY -m pytest -q -m gpu -p no:cacheprovider -k "fp8" tests/gpu/test_exec_gpu.py \
  tests/unit/test_host_fp8.py > "$OUT/pytest_gpu.txt" 2>&1
say "1. rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"

for dt in auto fp8_e4m3; do
  for nt in "" --no-transfer; do
    B=$(( $(left) - 150 ))
    if [ "$B" -lt 30 ]; then say "2. no time left for $dt $nt"; continue; fi
    say "2. bench $CTX x $N host_kv_dtype=$dt $nt (budget ${B}s)"
    timeout -k 10 "$B" $PY -X faulthandler "${BENCH[@]}" --concurrency "$N" --max-lanes "$N" --host-kv-dtype "$dt" \
      $nt --out "$OUT/fp8_host.jsonl" > "$OUT/bench_${dt}${nt:+_nt}.log" 2>&1
    say "2. rc=$? $(tail -c 300 "$OUT/bench_${dt}${nt:+_nt}.log" | tr '\n' ' ' | cut -c1-200)"
  done
done

say "3. the most $CTX-token requests the host memory holds"
$PY - "$CTX" > "$OUT/fp8_max.txt" 2>&1 <<'EOF'
import sys
from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_model
from oasis_exec.config import BenchConfig
from oasis_exec.kv.host_memory import POOL_SHARE, available_bytes
ctx = int(sys.argv[1])
geo = KVGeometry(get_model("qwen3-8b"), 16, 2)
blocks = -(-BenchConfig(context=ctx, steps=32, warmup=5).engine_max_context(16) // 16)  # the bench's max_blocks
avail = available_bytes()
from oasis_exec.kv.store import SparseStore
lanes = int(52e9 // SparseStore.bytes_per_lane(geo, 128, blocks))  # what the 52 GB GPU budget holds
for dt in ("auto", "fp8_e4m3"):
    per = blocks * geo.host_bytes_per_block(dt)
    print(f"{dt} per_request_gb={per / 1e9:.3f} max_requests={int(POOL_SHARE * avail // per)} "
          f"avail_gb={avail / 1e9:.1f} gpu_lanes_52gb={lanes}")
EOF
cat "$OUT/fp8_max.txt"
NMAX=$(awk '/^fp8_e4m3/ {sub("max_requests=", "", $3); print $3}' "$OUT/fp8_max.txt")
LANES=$(awk '/^fp8_e4m3/ {sub("gpu_lanes_52gb=", "", $5); print $5}' "$OUT/fp8_max.txt")
if [ -n "$NMAX" ] && [ -n "$LANES" ] && [ "$NMAX" -ge "$LANES" ]; then
  say "3. the GPU budget ($LANES lanes) binds before the host memory ($NMAX requests): no host-bound run"
elif [ -n "$NMAX" ]; then
  say "3. fp8 at $(( NMAX + 1 )) (the check should refuse it before pinning)"
  timeout -k 5 60 $PY "${BENCH[@]}" --concurrency $(( NMAX + 1 )) --host-kv-dtype fp8_e4m3 --steps 4 --warmup 1 \
    > "$OUT/bench_fp8_over.log" 2>&1
  say "3. rc=$? $(grep -m1 -o 'host KV pool: needs.*available' "$OUT/bench_fp8_over.log")"
  for n in $NMAX $(( NMAX - 1 )) $(( NMAX - 2 )); do
    B=$(( $(left) - 20 ))
    if [ "$B" -lt 60 ]; then say "3. no time left for fp8 at $n"; break; fi
    say "3. fp8 at $n (budget ${B}s)"
    timeout -k 10 "$B" $PY -X faulthandler "${BENCH[@]}" --concurrency "$n" --host-kv-dtype fp8_e4m3 --steps 16 \
      --warmup 3 --out "$OUT/fp8_max.jsonl" > "$OUT/bench_fp8_max.log" 2>&1
    rc=$?
    say "3. rc=$rc $(tail -c 300 "$OUT/bench_fp8_max.log" | tr '\n' ' ' | cut -c1-200)"
    [ $rc -eq 0 ] && break
  done
fi

say "4. table"
$PY - "$OUT" > "$OUT/fp8_host.md" 2>&1 <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = []
for name in ("fp8_host.jsonl", "fp8_max.jsonl"):
    p = os.path.join(out, name)
    if os.path.exists(p):
        rows += [json.loads(line) for line in open(p) if line.strip()]
print("| host copy | no-transfer | requests (asked) | clipped by | bytes/step (MB) | TPOT p50 / p99 (ms) | tok/s "
      "| host pool (GB) | transfer GB/s | hidden |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    f = lambda v, s="{:.3g}": "-" if v is None else s.format(v)
    print(f"| {r.get('host_kv_dtype')} | {r['no_transfer']} | {r['concurrency']} ({r['requested_concurrency']}) "
          f"| {r['clipped_by'] or '-'} | {r['bytes_moved_per_step'] / 1e6:.1f} | {r['tpot_ms_p50']:.2f} / "
          f"{r['tpot_ms_p99']:.2f} | {r['throughput_tok_s']:.0f} | {r['host_pool_bytes'] / 1e9:.1f} "
          f"| {f(r.get('transfer_gb_s'))} | {f(r.get('hidden_fraction'))} |")
print(f"\ncommit {rows[0]['commit'] if rows else '?'}, {rows[0]['device'] if rows else '?'}")
EOF
cat "$OUT/fp8_host.md"
say "done"
