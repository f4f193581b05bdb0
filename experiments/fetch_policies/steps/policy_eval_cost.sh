# Issue 39, item 3: the adaptive fetch-cap policies' own cost on ONE H200, separated from their bytes.
# (1) policy_eval_micro.py: DeviceCaps.cap of one layer alone, by rows (64..512), slots (K, 3K) and policy (~30 s).
# (2) the bench at the cost.sh point of one context ($1: 16384 -> 32 requests, 32768 -> 16), dummy Qwen3-8B, 52 GB,
#     synthetic selections (preset smollm2), --profile stage times: fixed 0.05, budget:0.5,max_ratio=0.05 and
#     budget:0.5, each with its --no-transfer twin (copies skipped, planning kept: the evaluation's cost without the
#     bytes' savings), and per-layer:0.05 (its copies' per-layer imbalance). Seven runs, ~60 s each (pinning, JIT).
#   OASIS_COMMIT=<hash> bash experiments/device.sh fetch_policies/policy_eval_cost 16384
#   OASIS_COMMIT=<hash> bash experiments/device.sh fetch_policies/policy_eval_cost 32768
#   -> $OUT/policy_eval_micro.json, $OUT/policy_eval_cost_<ctx>.jsonl, $OUT/policy_eval_cost.log
# Carries nothing beyond the working tree (dummy weights, synthetic selections).
DEADLINE_S=${DEADLINE_S:-580}
CTX=${1:-16384}
case "$CTX" in 16384) N=32 ;; 32768) N=16 ;; *) N=${2:-8} ;; esac
say "policy evaluation, isolated"
timeout -k 10 120 $PY experiments/fetch_policies/policy_eval_micro.py --device cuda --out "$OUT/policy_eval_micro.json" \
  2>&1 | tail -3 | tee "$OUT/policy_eval_cost.log"
for pol in fixed:0.05 budget:0.5,max_ratio=0.05 budget:0.5 per-layer:0.05; do
  for nt in "" --no-transfer; do
    if [ "$pol" = per-layer:0.05 ] && [ -n "$nt" ]; then continue; fi
    if [ "$(left)" -lt 75 ]; then say "out of time before $pol $nt"; break 2; fi
    say "bench ${CTX} x ${N} $pol $nt"
    timeout -k 10 $(( $(left) - 10 )) $PY -m oasis_exec bench --model qwen3-8b --dummy --mode lookahead \
      --kv-budget-gb 52 --context "$CTX" --concurrency "$N" --selection synthetic --synthetic '{"preset": "smollm2"}' \
      --fetch-policy "$pol" $nt --profile --steps 24 --warmup 4 --out "$OUT/policy_eval_cost_${CTX}.jsonl" \
      2>&1 | tail -4 | tee -a "$OUT/policy_eval_cost.log"
  done
done
say "done"
