# Issue 17, figure 2 again after two engine changes of 2026-12-02: plan_select's membership through rows of marks
# (ExecConfig.plan_marks, on by default), which the HiSparse-style baseline's hot cache (S = 2K) uses too, and the
# engine's victim cache by default (kv_layout.victim_slots: S = 3K where the lanes fit the budget). Here: the GPU
# tests at this commit, then lookahead (the engine's default, now S = 3K) and mode=hisparse at 16K x 44 and
# 32K x 22, same budget, same synthetic selection, one call. At f42f4b0 (compares, S = K) lookahead was 2.34x
# hisparse at 16K x 44 and 3.14x at 32K x 22; hisparse's miss reads stall its step.
# Prediction: hisparse faster than its 38.5 ms at 16K x 44 by <= 10% (its misses, not its plan, bind); lookahead
# ~13.0 ms (figures_victim_vllm_4e13b06): ~2.7x at 16K x 44, ~3x at 32K x 22.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/hisparse_marks
# (TESTS=0 DEADLINE_S=200 for the runs alone). Ran 2026-12-02 16:18 UTC at 6fa88eb (TESTS=0 DEADLINE_S=210):
# results/hisparse_marks_6fa88eb/.
DEADLINE_S=${DEADLINE_S:-330}
SYN=${SYN:-'{"preset": "smollm2"}'}
[ "${TESTS:-1}" = 1 ] && TEST_S=100 gpu_tests tests/gpu  # TESTS=0 skips them (no GPU test sets a budget)
B=$(( $(left) - 20 ))
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n "${LA_N:-16k=44;32k=22}" --max-n none \
  --nt-n none --sens-n "${LA_N:-16k=44;32k=22}" --variants "${VARIANTS:-mode=hisparse}" --anchors none \
  --synthetic-work model --exec decode_chain=8 --exec topk_kernel=fused --budget-s "$B" --steps 24 --warmup 4 \
  --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
