# Issue 39, item 2: how vLLM's least step time on a small model grows with the batch (its host loop a step), so that
# the calibrated predictor's step_floor can be a + b * requests instead of one constant fitted at 32 requests.
# vLLM 0.26 dense on the real SmolLM2-135M (GGUF, bf16), 7,800-token prompts, 256 decode tokens each, at 1, 2, 4, 8,
# 16, 24, 32, 48 and 64 requests; then 2,048-token prompts at the same concurrencies (less attention: the floor shows
# at more requests). These are TRAINING points for `oasis_sim calibrate` (traces/bench_points/train/), never the
# held-out set. Needs what dense_vs_lookahead_throughput/steps/baselines_more.sh needs: the vLLM bundle stashed
# (.vb/1, .vb/2 with `stash`; carry .vb/3) and the model's pieces (carry .models/b, see experiments/device.sh).
#   OASIS_COMMIT=<sha> bash experiments/device.sh simulator_calibration/vllm_host_floor
#   -> $OUT/vllm_floor_7800.json, $OUT/vllm_floor_2048.json (vllm_dense.py records: tpot_ms per conc)
# (8,096 + 256 tokens passes SmolLM2's 8,192 positions: vLLM's rope index asserts, results/vllm_floor_h100_1dc31ae/)
# Overrides: CTXS ('7800 2048': one vLLM engine each, the time left shared between them), CONCS (the list above).
DEADLINE_S=${DEADLINE_S:-560}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
if need_model; then
  read -r -a ctxs <<< "${CTXS:-7800 2048}"
  for i in "${!ctxs[@]}"; do
    T=$(( ($(left) - 15) / (${#ctxs[@]} - i) ))
    [ "$T" -gt 60 ] && vllm_run "floor_${ctxs[$i]}" "$T" --gguf "$M" --ctx "${ctxs[$i]}" --decode 256 \
      --conc "${CONCS:-1,2,4,8,16,24,32,48,64}"
  done
fi
say "done"
