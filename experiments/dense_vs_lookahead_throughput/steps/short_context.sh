# Short contexts in the executor (issue 15): lookahead with the rule on and off where every lane is short (1K), where
# every lane crosses inside the timed steps (2K: the window is 2,064 tokens at top-K 128), and dense at 1K; the
# short-context GPU tests first. Dummy Qwen3-8B, synthetic selection, 32 requests, 52 GB budget, 32 lanes.
#   OASIS_COMMIT=<hash> [NO_16K=1] bash experiments/device.sh dense_vs_lookahead_throughput/short_context  -> short_context.jsonl
# (16K: lookahead on and off where no lane is short, when time is left; NO_16K=1 skips them)
DEADLINE_S=${DEADLINE_S:-560}
gpu_tests tests/gpu/test_exec_gpu.py
J="$OUT/short_context.jsonl"
run() {  # label, bench args
  local label=$1; shift
  say "bench $label"
  timeout -k 5 120 $PY -m oasis_exec bench --model qwen3-8b --dummy --kv-budget-gb 52 --max-lanes 32 \
    --concurrency 32 --steps 24 --warmup 4 --selection synthetic --out "$J" "$@" > /dev/null 2>> "$OUT/bench.err" \
    || say "bench $label failed: $(tail -2 "$OUT/bench.err")"
}
run "dense 1K" --mode dense --context 1024
for c in 1024 2048; do
  run "lookahead ${c} off" --mode lookahead --context $c --no-short-context
  run "lookahead ${c} on" --mode lookahead --context $c --short-context
done
[ -z "${NO_16K:-}" ] && [ "$(left)" -gt 150 ] && for f in --no-short-context --short-context; do
  run "lookahead 16K $f" --mode lookahead --context 16384 $f
done
say "done"
