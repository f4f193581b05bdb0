# Issue 38: what the per-token scorer `tokens` costs in the decode step of the two small real-model shapes, where its
# shipped bases would make it the default (the Qwen3-8B-shape cost is step_time.sh's: -15 to -19%). Dummy weights
# (the shapes of Gemma 3 270M and SmolLM2-135M; random keys score any channels at the same cost, so the engine's
# first RoPE pairs stand in for the basis), the model's own selection (the scorer runs in every step), 3 GB of GPU KV,
# lookahead, fetch 0.05, CUDA graphs: Gemma at 32K (K = 256 of 2,048 blocks, 57 lanes, 768 slots a row) and SmolLM2
# at 7,800 tokens (K = 64, 64 lanes); per shape minmax_sum+sink, tokens (r = head_dim / 4: 2x the summary bytes),
# minmax_sum+sink again (the drift between the two); SmolLM2 also tokens:24 (r = 24: the rank block_score=auto takes
# for it). NAME:R in SCORERS is --token-rank R. No model pieces needed.
#   OASIS_COMMIT=<sha> [SCORERS='minmax_sum+sink tokens minmax_sum+sink'] bash experiments/device.sh block_scorers/small_models
#   -> $OUT/small_models.jsonl (bench records: block_score, tok/s, TPOT), small_*.log
DEADLINE_S=${DEADLINE_S:-300}
declare -A SHAPE=(
  [gemma]="--model gemma3-270m --context 32000 --top-k 256 --concurrency 57 --hot-slots 768"
  [smollm2]="--model smollm2-135m --context 7800 --top-k 64 --concurrency 64"
)
for shape in ${SHAPES:-gemma smollm2}; do
  default='minmax_sum+sink tokens minmax_sum+sink'; [ "$shape" = smollm2 ] && default='minmax_sum+sink tokens tokens:24 minmax_sum+sink'
  for s in ${SCORERS:-$default}; do
    name=${s%%:*}; rank=0; [ "$s" != "$name" ] && rank=${s##*:}
    T=$(min 60 $(( $(left) - 10 ))); [ "$T" -lt 25 ] && { say "no time for $shape $s"; continue; }
    # shellcheck disable=SC2086
    timeout -k 10 "$T" $PY -m oasis_exec bench --dummy ${SHAPE[$shape]} --mode lookahead --kv-budget-gb 3 \
      --selection model --no-host-fill --steps 24 --warmup 6 --block-score "$name" --token-rank "$rank" 2>> "$OUT/small_$shape.log" \
      | $PY -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); r["shape"] = sys.argv[1]; print(json.dumps(r))' "$shape" >> "$OUT/small_models.jsonl"
    say "$shape $s: $(tail -1 "$OUT/small_models.jsonl" | $PY -c 'import json, sys; r = json.loads(sys.stdin.read())
print(r.get("block_score"), r.get("token_rank"), r["concurrency"], round(r["throughput_tok_s"]), "tok/s", round(r["tpot_ms_p50"], 3), "ms")' 2>&1)"
  done
done
say done
