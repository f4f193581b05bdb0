# Issue 17, figure 1 at 16K: more lanes and a cheaper plan with a victim cache. victim_cache_c16fd83 hid the copies
# at 16K with S = 3K slots a row (hot_slots=384: overlap 1.015 at 44), but the step without copies grew to 14.67 ms
# (13.23 at S = K): plan_select's S x K membership compares held SMs beside the layers (4.0 ms a step). 3x vLLM's
# 1,117.9 tok/s needs 3,354 tok/s: 13.12 ms a token at 44, 14.31 at 48. Host memory: the 16K pool is 2.451 GB a
# request, 117.7 GB at 48 (MemAvailable 134.2 GB before the first pool at c16fd83: 16.5 GB left), and the 52 GB
# budget holds 48 lanes of S = 3K (1.07 GB a lane). Here, in one call: the kernels' tests on the GPU, plan_select
# alone with marks and with compares, then 16K x 48 and 16K x 44 with S = 3K and plan_marks (ExecConfig.plan_marks:
# membership through a zeroed row of marks a program, O(S + K)) and their no-transfer twins, the cap at 0.02 of K and
# its twin, and plan_marks off (the A/B).
# Prediction: plan_select with marks <= 40 us alone at 352 rows, S = 3K (71 by compares); at 44 the no-copy step
# <= 14.0 ms and TPOT ~14.3 (2.95x vLLM across calls); at 48 TPOT ~14.9 (2.88x), cap 0.02 ~14.5 (2.96x).
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/victim_lanes
DEADLINE_S=${DEADLINE_S:-330}
SYN=${SYN:-'{"preset": "smollm2"}'}
timeout -k 5 60 $PY -m pytest -q -p no:cacheprovider tests/integration/test_kernels_plan_select.py \
  tests/integration/test_kernels_attend_slots.py > "$OUT/pytest_kernels.txt" 2>&1
say "kernels against their references on the GPU: $(tail -1 "$OUT/pytest_kernels.txt")"
timeout -k 5 60 $PY experiments/dense_vs_lookahead_throughput/victim_kernels.py --out "$OUT/victim_kernels.jsonl" \
  --rows 352,384 --slots 128,384 > "$OUT/victim_kernels.txt" 2>&1 || say "victim_kernels failed: $(tail -2 "$OUT/victim_kernels.txt")"
cut -c1-200 "$OUT/victim_kernels.txt"
N=${LA_N:-16k=48,44}
V=${VARIANTS:-set=fetch_ratio:0.02,set=no_transfer:true+fetch_ratio:0.02,set=plan_marks:false}
timeout -k 10 $(( $(left) - 25 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k --dense-n none --la-n "$N" --max-n none --nt-n "$N" --sens-n "$N" \
  --variants "$V" --anchors none --repeat "${REPEAT:-1}" --synthetic-work model --exec decode_chain=8 \
  --exec topk_kernel=fused --exec hot_slots=384 --exec plan_marks=true --budget-s $(( $(left) - 35 )) --steps 24 \
  --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
