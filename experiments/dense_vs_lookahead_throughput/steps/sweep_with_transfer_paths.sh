#!/usr/bin/env bash
# Issue 5's H200 call (session 2 of 2026-11-30), in one command, on a 256 GiB-host machine (one GPU used):
#   cd .h200_src && OASIS_COMMIT=<hash> bash experiments/dense_vs_lookahead_throughput/steps/sweep_with_transfer_paths.sh
# 1. pytest -m gpu on the new kernels (fused_ops, plan_select) and the executor            -> $OUT/pytest_gpu.txt
# 2. experiments/dense_vs_lookahead_throughput/h200_sweep_with_transfer_paths.py: headline sweep (16K/32K, 52 GB), overlap twins, dense anchors, fused-vs-plain twins,
#    sensitivity at 16/48/80, then the transfer paths at 64/32/8, in one process (one pinning) -> $OUT/issue5.jsonl,
#    $OUT/transfer_paths.jsonl, $OUT/issue5.log. If plan_select's GPU test fails, the selection falls back to torch.
# Progress lines with timestamps go to stdout and $OUT/progress.log.
set -u
DEADLINE_S=${DEADLINE_S:-560}
. "$(dirname "$0")/h200_lib.sh"  # OUT, PY, el/left/say/min, device_info

say "commit $OASIS_COMMIT"
device_info

T1=$(min 120 $(( $(left) - 300 )))
say "1. pytest -m gpu (timeout ${T1}s)"
timeout -k 5 "$T1" $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_fused_ops.py \
  tests/test_kernels_plan_select.py tests/test_exec_gpu.py tests/test_exec_engine.py tests/test_kernels_gather.py \
  tests/test_kernels_sparse_attn.py tests/test_kernels_paged_attn.py tests/test_policy_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
say "1. pytest rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"
SEL=""
if grep -q "FAILED tests/test_kernels_plan_select\|ERROR tests/test_kernels_plan_select" "$OUT/pytest_gpu.txt"; then
  SEL=--torch-select
  say "plan_select failed on the GPU: measuring with the torch selection"
fi

for attempt in 1 2; do  # a second process resumes by label (e.g. after a sticky CUDA error, rc 3)
  B=$(( $(left) - 25 ))
  [ "$B" -lt 40 ] && break
  say "2. h200_sweep_with_transfer_paths.py attempt $attempt (budget ${B}s) $SEL"
  timeout -k 10 $(( B + 20 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_sweep_with_transfer_paths.py --out-dir "$OUT" --budget-s "$B" $SEL \
    --headline-args "--sens-n 16k=16,48,80 --fused-ab" --transfer-args "--programs 8,16,32 --threads 16" \
    2>&1 | tee -a "$OUT/issue5.log"
  rc=${PIPESTATUS[0]}
  say "2. rc=$rc: $(cat "$OUT"/issue5.jsonl "$OUT"/transfer_paths.jsonl 2>/dev/null | wc -l) records"
  [ "$rc" = 0 ] && break
done
say "done"
