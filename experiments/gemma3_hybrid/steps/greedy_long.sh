# Issue 36: Gemma 3 270M's greedy output on the engine (bf16, dense: rings for the sliding layers) against
# transformers' at 16K and 32K tokens (greedy_long.py; tie rule of tests/gpu/test_real_model_gpu.py), in dense and
# the five sparse modes with K covering every block (MODES to choose; all six at both lengths: one call, 153 s).
# The model: Gemma's GGUF in pieces, five with a slimmed tree (experiments/device.sh's header), else eight 32 MB
# pieces (/work/shared/models/README.md: `split -b 32M gemma-3-270m-q4_k_m.gguf .models/g/p_`, one piece a folder
# .models/a .. .models/h), `stash` calls back to back,
# the gguf wheel carried with the last piece. Run:
#   OASIS_COMMIT=<sha> MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
#     bash experiments/device.sh gemma3_hybrid/greedy_long
# Run on the H200 2026-12-05 at f174fe6: all six modes at 16K and 32K in one call (153 s; results/greedy_long_f174fe6/).
DEADLINE_S=${DEADLINE_S:-580}
need_model || exit 1
timeout -k 10 $(( $(left) - 10 )) $PY -X faulthandler experiments/gemma3_hybrid/greedy_long.py --gguf "$M" \
  --lengths "${LENGTHS:-16384,32704}" --modes "${MODES:-dense,lookahead,quest,retrieval,proxy,hisparse}" --out "$OUT/greedy_long.jsonl" 2>&1 \
  | grep -v "it/s\]" | tee "$OUT/greedy_long.log" | tail -20
say "done"
