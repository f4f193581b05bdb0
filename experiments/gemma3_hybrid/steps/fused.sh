# Gemma 3 with its layer ops fused (oasis_kernels.gemma_ops, a9ccff0): checked, then timed at the capacity table's
# shapes. Before it, a real Gemma step ran its norms, GELU and RoPE as plain torch (~80 small kernels a layer): at
# 841f50c (H100, results/capacity_841f50c/) dense at 28 lanes took 5.05 ms a step where the Llama family's fused path
# on the same shapes takes 2.27 (dummy weights, ../decode_step_profile, 1dc31ae) and the simulator says 2.25.
# In one call, after the model's five pieces (`stash` .models/a .. d, this call carries .models/e and WHL=.whl):
#   1. the kernels' tests compiled on the GPU (test_kernels_gemma_ops.py, test_kernels_fused_ops.py);
#   2. greedy_long.py: the engine's 64 greedy tokens (fused, CUDA graphs) against transformers' at 16K and 32K, dense
#      and lookahead (K covering every block), tie rule of tests/gpu/test_real_model_gpu.py;
#   3. capacity_vllm.sh's dense, dense_plain (--no-fused-ops: the plain ops on the same machine) and la128_s.
#   OASIS_COMMIT=<sha> MODEL_SHA256=a5fd3b62... MODEL_DIR=/tmp/mg WHL=.whl bash experiments/device.sh gemma3_hybrid/fused
# Prediction (written before the call): the tests pass; greedy_long identical or within the tie rule in every row;
# dense at 28 lanes 5.0 ms plain against 2.3-2.8 ms fused; lookahead K = 128, S = K at 112 lanes 7.29 -> 4.5-5.5 ms.
DEADLINE_S=${DEADLINE_S:-570}
need_model || exit 1
timeout -k 5 150 $PY -m pytest -q -p no:cacheprovider tests/unit/test_kernels_gemma_ops.py tests/unit/test_kernels_fused_ops.py \
  > "$OUT/pytest_gpu.txt" 2>&1; say "kernel tests: $(tail -1 "$OUT/pytest_gpu.txt")"
timeout -k 5 150 $PY experiments/gemma3_hybrid/greedy_long.py --gguf "$M" --lengths "${LENGTHS:-16384,32704}" \
  --modes "${MODES:-dense,lookahead}" --out "$OUT/greedy_long.jsonl" 2>&1 | grep -v "it/s\]" > "$OUT/greedy_long.log"
say "greedy_long: $(tail -3 "$OUT/greedy_long.log" | tr '\n' ' ' | cut -c1-400)"
PER_RUN_S=${PER_RUN_S:-110} MIN_RUN_S=${MIN_RUN_S:-50} . experiments/gemma3_hybrid/steps/capacity_vllm.sh ${PARTS:-dense dense_plain la128_s}
