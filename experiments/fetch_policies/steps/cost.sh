# Issue 16's cost points on ONE H200: lookahead with each fetch-cap policy (fixed 0.05 = the base run, unlimited,
# drift, per-layer:0.5, recall:0.9, budget:0.5) at 16K x 32 and 32K x 16 requests (one 77 GB host pool), dense at its
# 52 GB maximum, the no-transfer twin at 16K; dummy Qwen3-8B, synthetic selection from the preset fitted to SmolLM2
# (oasis_core.synthetic_presets "smollm2"). Estimate ~300 s (pinning 77 GB once, ~15 s a run).
#   OASIS_COMMIT=<hash> bash experiments/device.sh fetch_policies/cost     -> $OUT/cost.jsonl, cost.log
DEADLINE_S=${DEADLINE_S:-420}
B=$(( $(left) - 20 ))
say "policies cost sweep (budget ${B}s)"
timeout -k 10 $(( B + 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --preset policies --synthetic '{"preset": "smollm2"}' --out "$OUT/cost.jsonl" --budget-s "$B" 2>&1 \
  | grep -v " plan " | tee "$OUT/cost.log"
say "done"
