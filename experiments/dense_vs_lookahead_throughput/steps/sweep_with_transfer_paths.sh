# The full sweep with the transfer paths in one process (results/headline_full_sweep.md, 2026-11-30), on a 256 GiB
# host (kind nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/sweep_with_transfer_paths
# 1. pytest -m gpu on the new kernels (fused_ops, plan_select) and the executor            -> $OUT/pytest_gpu.txt
# 2. experiments/dense_vs_lookahead_throughput/h200_sweep_with_transfer_paths.py: headline sweep (16K/32K, 52 GB), overlap twins, dense anchors, fused-vs-plain twins,
#    sensitivity at 16/48/80, then the transfer paths at 64/32/8, in one process (one pinning) -> $OUT/headline.jsonl,
#    $OUT/transfer_paths.jsonl, $OUT/sweep.log. If plan_select's GPU test fails, the selection falls back to torch.
# Progress lines with timestamps go to stdout and $OUT/progress.log.
DEADLINE_S=${DEADLINE_S:-560}


T1=$(min 120 $(( $(left) - 300 )))
say "1. pytest -m gpu (timeout ${T1}s)"
TEST_S=$T1 gpu_tests tests/unit/test_kernels_fused_ops.py tests/integration/test_kernels_plan_select.py \
  tests/gpu/test_exec_gpu.py tests/integration/test_exec_engine.py tests/unit/test_kernels_gather.py \
  tests/unit/test_kernels_sparse_attn.py tests/unit/test_kernels_paged_attn.py tests/gpu/test_policy_gpu.py
SEL=""
if grep -q "FAILED tests/integration/test_kernels_plan_select\|ERROR tests/integration/test_kernels_plan_select" "$OUT/pytest_gpu.txt"; then
  SEL=--torch-select
  say "plan_select failed on the GPU: measuring with the torch selection"
fi

for attempt in 1 2; do  # a second process resumes by label (e.g. after a sticky CUDA error, rc 3)
  B=$(( $(left) - 25 ))
  [ "$B" -lt 40 ] && break
  say "2. h200_sweep_with_transfer_paths.py attempt $attempt (budget ${B}s) $SEL"
  timeout -k 10 $(( B + 20 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_sweep_with_transfer_paths.py --out-dir "$OUT" --budget-s "$B" $SEL \
    --headline-args "--sens-n 16k=16,48,80 --fused-ab" --transfer-args "--programs 8,16,32 --threads 16" \
    2>&1 | tee -a "$OUT/sweep.log"
  rc=${PIPESTATUS[0]}
  say "2. rc=$rc: $(cat "$OUT"/headline.jsonl "$OUT"/transfer_paths.jsonl 2>/dev/null | wc -l) records"
  [ "$rc" = 0 ] && break
done
say "done"
