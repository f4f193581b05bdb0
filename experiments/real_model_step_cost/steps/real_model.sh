# The real model on one H200, in calls back to back while the machine stays warm (it goes back 30 s after a call).
# The GGUF goes in four 26 MB pieces (experiments/device.sh's header: .models/a .. .models/d, the gguf wheel with the
# last): the working tree is 30 MB (2026-12-02), and a call carries 64 MiB.
#   calls 1-3 (carry .models/a, .models/b, .models/c): bash experiments/device.sh stash
#   call 4 (carry .models/d): OASIS_COMMIT=<hash> STAGE=quality bash experiments/device.sh real_model_step_cost/real_model
#                             (GPU tests, quality selection, then real_attention_quality/endtoend)
#   call 4 (no carry):        OASIS_COMMIT=<hash> STAGE=bench bash experiments/device.sh real_model_step_cost/real_model
#                             (five modes at 8K)
need_model || exit 1
DRAFT=experiments/trained_draft_head/smollm2-eagle3
COMMIT=$OASIS_COMMIT
case "${STAGE:-quality}" in
quality)
  say "pytest -m gpu"
  TEST_S=200 gpu_tests tests/
  say "quality selection"
  timeout ${SEL_S:-200} $PY -m oasis_exec quality selection --model-path $M \
    --texts GPL-3 MPL-2.0 Apache-2.0 argparse.py shlex.py --n-tokens 4096 8192 --k-frac 0.125 0.25 \
    --block-size 16 --positions 64 --drafts eagle3 ngram oracle random --draft-path $DRAFT \
    --device cuda --dtype bfloat16 --fit-draft eagle3 --commit $COMMIT \
    --out $OUT/selection.json 2>&1 | tr '\r' '\n' | grep -v -e Warning -e clean_up \
    | tee $OUT/selection.log | tail -30
  say "quality endtoend"
  BUDGET_S=${E2E_BUDGET_S:-190}
  . experiments/real_attention_quality/steps/endtoend.sh
  say done ;;
bench)
  for mode in ${MODES:-lookahead dense proxy quest retrieval}; do
    say "bench $mode"
    timeout ${RUN_S:-120} $PY -m oasis_exec bench --model-path $M --mode $mode --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT --out "$OUT/five_modes_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" || tail -5 "$OUT/bench.err"
  done
  for extra in ${EXTRAS:---no-transfer --profile}; do  # the overlap reference and the eager, profiled hidden fraction
    say "bench lookahead $extra"
    timeout ${RUN_S:-120} $PY -m oasis_exec bench --model-path $M --mode lookahead --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT $extra --out "$OUT/five_modes_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" \
      || tail -5 "$OUT/bench.err"
  done
  for preset in ${PRESETS:-paper smollm2}; do
    say "bench lookahead synthetic $preset"
    timeout ${RUN_S:-120} $PY -m oasis_exec bench --model-path $M --mode lookahead --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT --selection synthetic --synthetic "{\"preset\": \"$preset\"}" \
      --out "$OUT/five_modes_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" || tail -5 "$OUT/bench.err"
  done
  $PY - "$OUT/five_modes_8k.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['mode']:9s} {r['selection']:9s} {str(r.get('synthetic_params')):22s} n={r['concurrency']:3d} "
          f"tok/s={r['throughput_tok_s']:8.1f} tpot={r['tpot_ms_p50']:.2f}ms bytes/step={r['bytes_moved_per_step']/1e6:.2f}MB "
          f"drift/step={r['drift_blocks_per_step']:.0f} path={r['transfer_path']} hidden={r['hidden_fraction']} "
          f"no_transfer={r['no_transfer']} profiled={'layer_ms' in r and r['layer_ms'] is not None}")
PY
  say done ;;
esac
