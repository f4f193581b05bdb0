# Speculative decoding (issue 18) on ONE H200, in one call after the model's pieces are stashed (see
# experiments/real_model_step_cost/steps/real_model.sh for the carries: calls 1, 2 `bash experiments/device.sh stash`
# carrying .models/a then .models/c; this call carries .models/b, the last piece and the gguf wheel):
#   OASIS_COMMIT=<hash> bash experiments/device.sh speculative_decoding/h200
# 1. pytest -m gpu -k spec (tests/gpu/test_real_model_gpu.py: greedy speculative == greedy ordinary on the real model,
#    dense and lookahead at K = all; graphs off == graphs on; tests/gpu/test_exec_gpu.py: speculative graphs == eager)                               -> $OUT/pytest_gpu.txt
# 2. the CPU study's sweep on cuda bf16: SmolLM2-135M + trained EAGLE-3 head, dense and lookahead, 4096 and 7800
#    tokens (7,800 + the phases' 313 tokens of decode room fit the 8,192 positions), k in {0, 1, 2, 3, auto:3} over one prefill per (mode, context), plus k = 0 of an engine of its own
#    (CUDA graphs on) and k = 0 eager (graphs off); greedy speculative steps run as CUDA graphs too (spec_core)
#                                                              -> $OUT/spec_h200.jsonl, spec_h200.md, spec_h200.log
# 3. dummy Qwen3-8B at 16K x 32, lookahead, synthetic selection (preset smollm2), k = 2 and k = 1 with the acceptance
#    drawn from the CPU real model's lookahead k = 2 / k = 1 histogram (--synthetic-accept, benchmark only) and k = 0
#    (between them), each recorded for
#    the simulator (experiments/speculative_decoding/replay_spec.py on the CPU afterwards)
#                                     -> $OUT/qwen_spec.jsonl, qwen_k2.json, qwen_k0.json, qwen_k1.json, qwen.log
# Estimate ~300 s (measured at 2868b70: tests 76 s, the sweep 73 s, each Qwen run ~45 s, most of it pinning 78 GB).
# Overrides: DEVICE=cpu (a dry run: float32, tiny shapes, QWEN_MODEL=tiny), N (16), STEPS (16), WARMUP (4),
# CONTEXTS ("4096 7800"), QWEN_N (32), QWEN_CONTEXT (16384), QWEN_MODEL (qwen3-8b), SPEC_ACCEPT (a JSON acceptance),
# QWEN_EAGER=1 (also Qwen k = 0 eager, qwen_k0e.json: the speculative step's eager baseline), SKIP_TESTS=1.
DEADLINE_S=${DEADLINE_S:-400}
DEVICE=${DEVICE:-cuda}
DTYPE=$([ "$DEVICE" = cpu ] && echo float32 || echo bfloat16)
need_model || exit 1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  say "pytest -m gpu -k spec"
  if [ "$DEVICE" = cpu ]; then export OASIS_GPU_TESTS_DEVICE=cpu; fi
  TEST_S=${TEST_S:-150} gpu_tests -k spec tests/gpu/test_real_model_gpu.py tests/gpu/test_exec_gpu.py
fi

say "real-model sweep on $DEVICE $DTYPE (left $(left)s)"
B=$(min $(( $(left) - ${QWEN_RESERVE_S:-180} )) ${SWEEP_S:-200})
[ "$B" -lt 30 ] && { say "only ${B}s for the sweep: skipped"; B=1; }
# shellcheck disable=SC2086
[ "$B" -gt 1 ] && timeout -k 10 "$B" $PY experiments/speculative_decoding/spec_study.py --device "$DEVICE" --dtype "$DTYPE" \
  --model-path "$M" --contexts ${CONTEXTS:-4096 7800} --concurrency "${N:-16}" --steps "${STEPS:-16}" \
  --warmup "${WARMUP:-4}" --fresh-k0 ${CONTEXTS:-4096 7800} --fresh-k0-modes dense lookahead --eager-k0 \
  --out "$OUT/spec_h200.jsonl" 2>&1 | grep -v -e Warning -e warn | tee "$OUT/spec_h200.log" | tail -40
[ -f "$OUT/spec_h200.jsonl" ] && $PY experiments/speculative_decoding/spec_study.py --table-only "$OUT/spec_h200.jsonl" \
  > /dev/null

# the acceptance of the CPU real model's lookahead k = 1 and k = 2 runs (the longest context's), unless SPEC_ACCEPT
# gives one for every k
cpu_hist() {  # K -> that run's accepted_hist (JSON)
  $PY - "$1" <<'PY'
import json, sys
recs = [json.loads(l) for l in open("experiments/speculative_decoding/results/spec_cpu.jsonl")]
recs = [r for r in recs if r["mode"] == "lookahead" and r["speculative_k"] == int(sys.argv[1]) and r.get("accepted_hist")]
print(json.dumps(max(recs, key=lambda r: r["context"])["accepted_hist"]))
PY
}
ACC1=${SPEC_ACCEPT:-$(cpu_hist 1)}
ACC=${SPEC_ACCEPT:-$(cpu_hist 2)}
say "Qwen3-8B-shape dummy, lookahead, synthetic acceptance k=1 $ACC1, k=2 $ACC (left $(left)s)"
QM=${QWEN_MODEL:-qwen3-8b}
if [ "$DEVICE" = cpu ]; then QARGS=(--record-hardware h200 --kv-budget-gb 1 --top-k 8); else QARGS=(--kv-budget-gb 52); fi
for k in 2 0 1 ${QWEN_EAGER:+0e}; do  # 0e: k = 0 with CUDA graphs off (QWEN_EAGER=1; another ~50 s)
  EXTRA=(); [ "$k" = 2 ] && EXTRA=(--synthetic-accept "$ACC")
  [ "$k" = 1 ] && EXTRA=(--synthetic-accept "$ACC1")
  [ "$k" = 0e ] && EXTRA=(--no-cuda-graph)
  T=$(min $(( $(left) - 5 )) ${QWEN_RUN_S:-120})
  [ "$T" -lt 30 ] && { say "no time left for the k=$k run"; break; }
  timeout -k 10 "$T" $PY -m oasis_exec bench --model "$QM" --dummy --device "$DEVICE" --dtype "$DTYPE" \
    --mode lookahead --context "${QWEN_CONTEXT:-16384}" --concurrency "${QWEN_N:-32}" --steps "${STEPS:-16}" \
    --warmup "${WARMUP:-4}" --selection synthetic --synthetic '{"preset": "smollm2"}' --no-host-fill \
    --speculative-k "${k%e}" "${EXTRA[@]}" "${QARGS[@]}" --record "$OUT/qwen_k$k.json" --out "$OUT/qwen_spec.jsonl" \
    2>> "$OUT/qwen.log" | $PY -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    f = "qwen k=%s graphs=%s n=%s tok/s=%.1f step p50=%.2f ms tokens/step=%.3f acceptance=%s hist=%s"
    print(f % (r["speculative_k"], r.get("cuda_graph"), r["concurrency"], r["throughput_tok_s"], r["tpot_ms_p50"],
               r["accepted_tokens_per_step"], r["acceptance"], r["accepted_hist"]))' | tee -a "$OUT/qwen.log" \
    || tail -5 "$OUT/qwen.log"
done
say done
