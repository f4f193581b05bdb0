# Every gpu-marked test (the real model's too, when its pieces were stashed: device.sh stash), into pytest_gpu.txt.
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/gpu_tests
DEADLINE_S=${DEADLINE_S:-300}
need_model || say "no real model: its GPU tests skip"
TEST_S=${TEST_S:-280} gpu_tests
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -20
