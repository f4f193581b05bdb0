# Issue 17: what sits between two graphs of a decode chain. At dc6e77f chain 8 ran 17.48 ms a token at 16K x 44
# against a graph span of ~16.0 ms, so ~1.5 ms a pass is outside the graphs. At chain 1 the eager GPU work between
# two graphs is ~0.35-0.38 ms (draft head GEMMs, argmax; traces_16_319a24f, critical_path.py "to the next graph").
# Here: 16K x 44 and x 16 profiled with --decode-chain 8 (and 1 at 44), traces kept, critical_path.py on them.
# Run at f143ed3: results/chain_gaps_f143ed3/. Prediction: ~0.4 ms of eager kernels and ~1 ms of idle GPU between chained graphs
# (the host's launches of the next pass not far enough ahead).
#   OASIS_COMMIT=<sha> bash experiments/device.sh decode_step_profile/chain_gaps   -> *.json.gz, profiles.*, critical_path.txt
DEADLINE_S=${DEADLINE_S:-400}
SYN=${SYN:-'{"preset": "smollm2"}'}
P=($PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" --top 30
  --steps 2 --out "$OUT/profiles.jsonl" --mode lookahead --context 16384)
for spec in "c8n44 --concurrency 44 --decode-chain 8" "c8n16 --concurrency 16 --decode-chain 8" "c1n44 --concurrency 44"; do
  set -- $spec; name=$1; shift
  T=$(min 120 $(( $(left) - 20 ))); [ "$T" -lt 40 ] && { say "no time for $name"; continue; }
  say "profile $name"
  echo "#### $name" >> "$OUT/profiles.txt"
  timeout -k 5 "$T" "${P[@]}" "$@" --trace-out "$OUT/$name.json.gz" >> "$OUT/profiles.txt" 2>&1 || say "failed: $name"
  $PY experiments/decode_step_profile/critical_path.py "$OUT/$name.json.gz" >> "$OUT/critical_path.txt" 2>&1
done
say "done"
