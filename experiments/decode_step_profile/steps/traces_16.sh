# Issue 17, overlap at 16 requests: the 16K x 16 lookahead step and its no-transfer twin (and 16K x 44 lookahead), their
# Chrome traces brought back for a closer look than critical_path.py's summary (what the main stream waits for in the
# graph's head, 0.41 ms against 0.16 without copies at a9d253e). Dummy Qwen3-8B, synthetic smollm2 selection.
#   OASIS_COMMIT=<sha> bash experiments/device.sh decode_step_profile/traces_16   -> *.json.gz, profiles.txt, critical_path.txt
DEADLINE_S=${DEADLINE_S:-300}
SYN=${SYN:-'{"preset": "smollm2"}'}
P=($PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" --top 30
  --steps 2 --out "$OUT/profiles.jsonl")
for spec in "la16k16 --concurrency 16" "nt16k16 --concurrency 16 --no-transfer" "la16k44 --concurrency 44"; do
  set -- $spec; name=$1; shift
  T=$(min 120 $(( $(left) - 20 ))); [ "$T" -lt 40 ] && { say "no time for $name"; continue; }
  say "profile $name"
  echo "#### $name" >> "$OUT/profiles.txt"
  timeout -k 5 "$T" "${P[@]}" --mode lookahead --context 16384 "$@" --trace-out "$OUT/$name.json.gz" \
    >> "$OUT/profiles.txt" 2>&1 || say "failed: $name"
  $PY experiments/decode_step_profile/critical_path.py "$OUT/$name.json.gz" >> "$OUT/critical_path.txt" 2>&1
done
ls -la "$OUT"
say "done"
