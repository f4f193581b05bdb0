# The sliding layers' ring kernel (oasis_kernels.ring_attn, issue 39) before its step profile: its GPU tests (Gemma
# 3 270M's shape against the torch path, a CUDA graph replay, a tiny Gemma engine with the kernel on and off), then
# oasis_kernels.bench on it (the 15 sliding layers a step at 128 / 57 / 28 lanes; block_n x warps x stages, then the
# split count at the best; ms_torch: the torch path of the same layers).
#   OASIS_COMMIT=<hash> [BENCH_S=300] bash experiments/device.sh decode_step_profile/ring_attn   -> pytest_gpu.txt, ring_attn_bench.*
DEADLINE_S=${DEADLINE_S:-540}
TEST_S=${TEST_S:-200} gpu_tests tests/gpu/test_ring_attn_gpu.py
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -20
T=$(min "${BENCH_S:-300}" $(( $(left) - 10 )))
say "bench ring_attn (${T} s)"
timeout -k 5 "$T" $PY -m oasis_kernels.bench --only ring_attn --out "$OUT/ring_attn_bench.json" \
  > "$OUT/ring_attn_bench.txt" 2>&1 || say "bench failed or cut: $(tail -2 "$OUT/ring_attn_bench.txt")"
say "done"
