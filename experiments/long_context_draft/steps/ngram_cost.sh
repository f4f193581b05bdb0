# What prompt lookup on the device (--draft-ngram 2, runner/ngram_drafts.py) costs a decode step, to decide its
# default (the long_context_draft README, "The lookup on the device"). After a call that stashed SmolLM2's pieces
# (MODEL_DIR=/tmp/ms), with its head carried:
#   MODEL_DIR=/tmp/ms OASIS_COMMIT=<sha> bash experiments/device.sh long_context_draft/ngram_cost
# 1. real SmolLM2-135M, its trained single-key head, the model's selection, 7,936 tokens x 16 requests, K = 64,
#    prompts cut from traces/texts/argparse.py.txt (the lookup matches there): --draft-ngram 0, 2, 0, 2 (interleaved)
# 2. dummy Qwen3-8B, synthetic selection, 16K x 44 at 52 GB (a synthesized prefill never matches; the lookup still
#    runs and costs the same): --draft-ngram 0, 2                                              -> $OUT/ngram.jsonl
DEADLINE_S=${DEADLINE_S:-560}
SMOL=1; need_model || { say "no real model: SmolLM2 rows skipped"; SMOL=0; }
one() {  # LABEL SECONDS ARGS...
  local label=$1 t; t=$(min "$2" $(( $(left) - 5 ))); shift 2
  [ "$t" -lt 25 ] && { say "no time for $label"; return; }
  say "$label"
  timeout -k 5 "$t" $PY -m oasis_exec bench "$@" --out "$OUT/ngram.jsonl" > "$OUT/$label.log" 2>&1 \
    || say "failed: $(tail -2 "$OUT/$label.log" | cut -c1-300)"
}
if [ "$SMOL" = 1 ]; then
  for n in 0 2 0 2; do
    one "smollm2_ngram$n" 60 --model-path "$M" --draft-path experiments/trained_draft_head/smollm2-eagle3 \
      --mode lookahead --context 7936 --concurrency 16 --max-lanes 16 --top-k 64 --steps 24 --warmup 4 \
      --prompt-text traces/texts/argparse.py.txt --draft-ngram "$n"
  done
fi
for n in 0 2; do
  one "qwen3_ngram$n" 120 --model qwen3-8b --dummy --mode lookahead --kv-budget-gb 52 --context 16384 \
    --concurrency 44 --selection synthetic --steps 24 --warmup 4 --draft-ngram "$n"
done
$PY - "$OUT/ngram.jsonl" <<'PY' | tee "$OUT/ngram.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | weights | selection | context x requests | draft_ngram | drafts by lookup | tok/s | TPOT p50 ms |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['model'].split('/')[-1]} | {'dummy' if r['dummy_weights'] else 'real'} | {r['selection']} "
          f"| {r['context']} x {r['concurrency']} | {r.get('draft_ngram')} | {r.get('draft_ngram_used')} "
          f"| {r['throughput_tok_s']:.0f} "
          f"| {r['tpot_ms_p50']:.3f} |")
PY
say "done"
