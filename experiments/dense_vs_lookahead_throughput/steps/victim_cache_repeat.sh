# Issue 17, figure 3 with a victim cache, repeated: victim_cache_c16fd83 measured lookahead at S = 3K slots a row
# (ExecConfig.hot_slots=384) at 16K with overlap 1.015 at 44 requests and 1.007 at 16, one run each. Here every point
# twice (--repeat 2), at 16K x 44 and 16K x 16: S = K and S = 3K with their no-transfer twins, and S = 3K with the
# cap at 0.02 of K (on real attention the cap of 0.02 kept the mass of 0.05:
# ../draft_predicts_next_blocks/results/victim_slots_cpu/).
# Since c16fd83, plan_select can find membership through a zeroed row of marks a program (O(S + K)) where a row
# holds more blocks than it attends (ExecConfig.plan_marks, off by default: not yet timed on the H200; the session
# that wrote it ran out of device time, 2026-12-02). The step runs the kernels' tests, both kernels alone (marks on
# and off), the runs, then the victim cache's GPU tests. Prediction: plan_select at S = 3K <= 40 us alone at 352
# rows with marks (71 by compares at c16fd83); with marks S = 3K's no-copy step <= 14.0 ms at 44 (14.67 at c16fd83)
# and TPOT ~14.3; overlap <= 1.03 in both repeats; S = 3K at 0.02 about its twin. Not yet run.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/victim_cache_repeat
# (LA_N, REPEAT, VARIANTS and DEADLINE_S shrink it: LA_N='16k=44' REPEAT=1 for one pass at 44)
DEADLINE_S=${DEADLINE_S:-270}
SYN=${SYN:-'{"preset": "smollm2"}'}
timeout -k 5 60 $PY -m pytest -q -p no:cacheprovider tests/integration/test_kernels_plan_select.py \
  tests/integration/test_kernels_attend_slots.py > "$OUT/pytest_kernels.txt" 2>&1
say "kernels against their references on the GPU: $(tail -1 "$OUT/pytest_kernels.txt")"
timeout -k 5 60 $PY experiments/dense_vs_lookahead_throughput/victim_kernels.py --out "$OUT/victim_kernels.jsonl" \
  --rows 352,128 --slots 128,384 > "$OUT/victim_kernels.txt" 2>&1 || say "victim_kernels failed: $(tail -2 "$OUT/victim_kernels.txt")"
cut -c1-200 "$OUT/victim_kernels.txt"
V=${VARIANTS:-set=hot_slots:384,set=no_transfer:true+hot_slots:384,set=hot_slots:384+plan_marks:true,set=no_transfer:true+hot_slots:384+plan_marks:true,set=hot_slots:384+fetch_ratio:0.02}
timeout -k 10 $(( $(left) - 65 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k --dense-n none --la-n "${LA_N:-16k=44,16}" --max-n none \
  --nt-n "${LA_N:-16k=44,16}" --sens-n "${LA_N:-16k=44,16}" --variants "$V" --anchors none --repeat "${REPEAT:-2}" \
  --synthetic-work model --exec decode_chain=8 \
  --exec topk_kernel=fused --budget-s $(( $(left) - 75 )) --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 \
  | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
TEST_S=$(( $(left) - 5 )) gpu_tests tests/gpu/test_exec_gpu.py -k "victim or hisparse"
say "done"
