# Issue 17: what the 16K lookahead step's main stream waits for, at 44 and 16 requests, against the no-transfer twins
# and the fp8 (e4m3) host copy at 44 (why halving the bytes bought nothing there), from the profiles' Chrome traces
# (critical_path.py); and plan_select's launch parameters alone (plan_select_sweep.py). Dummy Qwen3-8B, synthetic
# selection of the smollm2 preset, top-K 128, fetch 0.05, 52 GB, UVA, CUDA graphs, one decode step a step.
#   OASIS_COMMIT=<hash> bash experiments/device.sh decode_step_profile/critical_path_16k
#   -> profiles.jsonl, profiles.txt, critical_path.txt/.jsonl, plan_select_sweep.json
DEADLINE_S=${DEADLINE_S:-570}
SYN=${SYN:-'{"preset": "smollm2"}'}
TR=/tmp/traces; mkdir -p "$TR"
P=($PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" --top 30
  --steps 2 --out "$OUT/profiles.jsonl")
run() {  # NAME ARGS...
  local name=$1; shift
  T=$(min 130 $(( $(left) - 60 ))); [ "$T" -lt 40 ] && { say "no time for $name"; return; }
  say "profile $name: $*"
  echo "#### $name: $*" >> "$OUT/profiles.txt"
  timeout -k 5 "$T" "${P[@]}" "$@" --trace-out "$TR/$name.json.gz" >> "$OUT/profiles.txt" 2>&1 \
    || say "failed: $name $(tail -2 "$OUT/profiles.txt")"
}
run la16k44 --mode lookahead --context 16384 --concurrency 44
run nt16k44 --mode lookahead --context 16384 --concurrency 44 --no-transfer
run fp16k44 --mode lookahead --context 16384 --concurrency 44 --host-kv-dtype fp8_e4m3
run la16k16 --mode lookahead --context 16384 --concurrency 16
run nt16k16 --mode lookahead --context 16384 --concurrency 16 --no-transfer
say "critical paths"
for f in "$TR"/*.json.gz; do
  timeout -k 5 60 $PY experiments/decode_step_profile/critical_path.py "$f" --out "$OUT/critical_path.jsonl" \
    >> "$OUT/critical_path.txt" 2>&1 || say "critical_path failed: $f"
done
T=$(min 90 $(( $(left) - 5 )))
if [ "$T" -ge 30 ]; then
  say "plan_select sweep"
  timeout -k 5 "$T" $PY experiments/decode_step_profile/plan_select_sweep.py --out "$OUT/plan_select_sweep.json" \
    > "$OUT/plan_select_sweep.txt" 2>&1 || say "sweep failed: $(tail -2 "$OUT/plan_select_sweep.txt")"
fi
say "done"
