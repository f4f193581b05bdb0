# Issue 17, figure 3 with a victim cache, repeated: victim_cache_c16fd83 measured lookahead at S = 3K slots a row
# (ExecConfig.hot_slots=384) at 16K with overlap 1.015 at 44 requests and 1.007 at 16, one run each. Here every point
# twice (--repeat 2), at 16K x 44 and 16K x 16: S = K and S = 3K with their no-transfer twins, and S = 3K with the
# cap at 0.02 of K (on real attention the cap of 0.02 kept the mass of 0.05:
# ../draft_predicts_next_blocks/results/victim_slots_cpu/).
# Prediction: S = 3K within +-0.2 ms of c16fd83 (14.89 ms at 44, 9.47 at 16), overlap <= 1.03 in both repeats;
# S = 3K at 0.02 about S = 3K's twin (its copies: ~20 MB a step at 44).
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/victim_cache_repeat
DEADLINE_S=${DEADLINE_S:-330}
SYN=${SYN:-'{"preset": "smollm2"}'}
V=${VARIANTS:-set=hot_slots:384,set=no_transfer:true+hot_slots:384,set=hot_slots:384+fetch_ratio:0.02}
timeout -k 10 $(( $(left) - 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k --dense-n none --la-n '16k=44,16' --max-n none --nt-n '16k=44,16' \
  --sens-n '16k=44,16' --variants "$V" --anchors none --repeat 2 --synthetic-work model --exec decode_chain=8 \
  --exec topk_kernel=fused --budget-s $(( $(left) - 20 )) --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 \
  | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
