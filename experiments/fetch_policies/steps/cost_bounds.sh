# What bounds the adaptive policies' cost on the H200 (after steps/cost.sh): the same points as cost.sh with
# variants that separate the copy list's width (max_cap), the bytes and the policy's own evaluation: per-layer at the
# fixed cap's total (0.05), budget:0.5 capped at the fixed width, a static fixed:0.25 (drift's ceiling, no
# evaluation), drift and recall capped at 0.1. Estimate ~120 s.
#   OASIS_COMMIT=<hash> bash experiments/device.sh fetch_policies/cost_bounds   -> $OUT/cost_bounds.jsonl, .log
DEADLINE_S=${DEADLINE_S:-240}
B=$(( $(left) - 20 ))
say "policies cost bounds (budget ${B}s)"
timeout -k 10 $(( B + 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --preset policies --synthetic '{"preset": "smollm2"}' --dense-n none --nt-n none --out "$OUT/cost_bounds.jsonl" \
  --variants "pol=per-layer:0.05,pol=budget:0.5+max_ratio=0.05,pol=fixed:0.25,pol=drift:max_ratio=0.1,pol=recall:0.9+max_ratio=0.1" \
  --budget-s "$B" 2>&1 | grep -v " plan " | tee "$OUT/cost_bounds.log"
say "done"
