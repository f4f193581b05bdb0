# Issue 39: why the capacity table's Gemma steps are ~2.2x the dummy-weight profile's. At 841f50c (H100,
# results/capacity_841f50c/) the real-weight bench ran dense at 28 lanes in 5.05 ms a step and lookahead K = 128,
# S = K at 112 lanes in 7.29 ms; the dummy-weight profile (../decode_step_profile, 1dc31ae, same shapes, synthesized
# prefill) 2.27 ms and 5.19 ms (128 lanes), and the calibrated simulator says 2.25 and 3.01 ms. The bench differs
# from the profile in the weights (real), the prefill (real prompts, chunks of 8,192) and the decode chains (8).
# This step holds the weights (dummy, no model to carry) and the chains (8) fixed and varies the prefill only:
# synthesized KV against the same prompts' token ids prefilled for real (data/gemma_32k.npz training row 0, wrapped as the bench wraps a text).
#   OASIS_COMMIT=<sha> bash experiments/device.sh gemma3_hybrid/prefill_gap [RUNS]   -> $OUT/gap.jsonl
# Found before the first call: dummy weights built the Llama family's decoder (fused RMSNorm / SwiGLU / q-k norm +
# RoPE kernels) for the gemma3-270m preset, the real model Gemma3Decoder (plain torch: six (1 + w) norms a layer in
# fp32, GELU, RoPE). Since ModelSpec.family a dummy Gemma builds Gemma3Decoder too, so this step now also measures the
# decoder: prediction (written before the call) dense with synthesized prefill ~4.5-5.3 ms (the real run's 5.05),
# the same with the real ids' prefill, lookahead K = 128 at 112 lanes ~6.5-7.5 ms (7.29).
DEADLINE_S=${DEADLINE_S:-560}
B=($PY -m oasis_exec bench --model gemma3-270m --dummy --device cuda --context 32000 --kv-budget-gb 3
  --concurrency 128 --steps 24 --warmup 4 --selection model --out "$OUT/gap.jsonl")
NPZ=(--prompt-text experiments/long_context_draft/data/gemma_32k.npz:train:0 --prefill-chunk 8192)
declare -A ARGS=(
  [dense_syn]="--mode dense"
  [dense_real]="--mode dense ${NPZ[*]}"
  [la128_syn]="--mode lookahead --top-k 128 --hot-slots 128"
  [la128_real]="--mode lookahead --top-k 128 --hot-slots 128 ${NPZ[*]}"
)
for name in ${RUNS:-dense_syn dense_real la128_syn la128_real}; do
  t=$(min 150 "$(( $(left) - 15 ))")
  if [ "$t" -lt 40 ]; then say "no time left for $name"; continue; fi
  say "$name: ${ARGS[$name]}"
  # shellcheck disable=SC2086
  timeout -k 10 "$t" "${B[@]}" ${ARGS[$name]} > "$OUT/bench_$name.log" 2>&1 || say "$name failed: $(tail -2 "$OUT/bench_$name.log" | cut -c1-300)"
  $PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print('   ', r['mode'], r['concurrency'], 'lanes', round(r['tpot_ms_p50'],3), 'ms', r.get('prefill'))" "$OUT/gap.jsonl" 2>/dev/null
done
say "done"
