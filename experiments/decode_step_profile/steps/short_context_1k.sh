# Where a resident-dense step (every lane short, issue 15) spends its time against dense: kernel profiles of dense
# and lookahead (short context on, then off) at 1K context, 32 requests, dummy Qwen3-8B, synthetic selection.
#   OASIS_COMMIT=<hash> bash experiments/device.sh decode_step_profile/short_context_1k   -> short_context_1k.jsonl
DEADLINE_S=${DEADLINE_S:-500}
gpu_tests tests/gpu/test_exec_gpu.py -k short_context
P="$PY experiments/decode_step_profile/step_profile.py --context 1024 --concurrency 32 --kv-budget-gb 52 --top 30"
for m in "--mode dense" "--mode lookahead --short-context" "--mode lookahead" "--mode proxy --short-context"; do
  say "profile $m"
  timeout -k 5 120 $P $m --out "$OUT/short_context_1k.jsonl" > "$OUT/profile_$(echo $m | tr -c 'a-z' _).txt" 2>&1 || say "failed: $m"
done
say "done"
