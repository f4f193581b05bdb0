# Speculation and lookahead pipelined (issue 40: spec_predict beside against after against no speculation) on ONE
# H200, in one call after the real model's pieces are stashed (experiments/real_model_step_cost/steps/real_model.sh
# for the carries: calls 1, 2 `bash experiments/device.sh stash` carrying .models/a then .models/c; this call carries
# .models/b, the last piece and the gguf wheel):
#   OASIS_COMMIT=<hash> bash experiments/device.sh speculative_decoding/pipelined
# 1. pytest -m gpu: tests/gpu/test_spec_pipeline_gpu.py (beside in graphs = eager at k = 1, 2, 3 with repairs; on
#    the side streams it attends what after attends), test_exec_gpu.py -k speculative and the repair kernel at the
#    bench's shape (tests/unit/test_kernels_spec_repair.py, compiled)                          -> $OUT/pytest_gpu.txt
# 2. the goal table, real weights (SmolLM2-135M + the trained EAGLE-3 head, bf16), the model's own selection and
#    acceptance, 7,800 tokens cut from traces/texts/argparse.py.txt, prefilled for real, K = 64, the same GPU KV
#    budget for every run (KV_GB, 3 GB): lookahead at N_LOOK requests (clipped to the lanes the budget holds) with
#    spec_predict after (k = 0, 1, 2 over one prefill: k = 0 is lookahead without speculation) and beside (k = 1, 2);
#    dense at N_DENSE (k = 0, 1)            -> $OUT/smol.jsonl (records name spec_predict and the repaired lane-steps)
# 3. the Qwen3-8B shape (dummy weights, synthetic selection preset smollm2) at 16K x 44, 52 GB, lookahead: k = 0,
#    k = 1 after, k = 1 beside, with the acceptance drawn from the real head's H200 lookahead k = 1 histogram at 7,800
#    tokens (results/h200_2868b70/spec_h200.jsonl: {"1": [145, 111]}, 43% of first drafts accepted); and the
#    no-transfer twins of k = 0 and k = 1 beside (the overlap: TPOT / twin) -> $OUT/qwen.jsonl, qwen_*.json recordings
#    With synthetic selection the true and the chosen prediction are the same drawn set: the repair plans run (their
#    cost is in the step) but copy nothing; the real model's repairs are in smol.jsonl.
# 4. $OUT/summary.md: the goal table (tok/s, TPOT, speed-ups against lookahead without speculation and against dense
#    with speculation; the overlap ratios).
# Estimate ~480 s (tests ~70 s; the SmolLM2 runs ~25 s each after a ~10 s prefill; each Qwen run ~50 s, most of it
# pinning the host pool). Overrides: DEVICE=cpu (a dry run: float32, tiny shapes, QWEN_MODEL=tiny), SKIP_TESTS=1,
# SKIP_SMOL=1, SKIP_QWEN=1, QWEN_RUNS (names of the loop below, k1_after_nt among them; NAME@W: W warm-up steps, e.g. k0@40 once the victim
# cache has filled), N_LOOK (64), N_DENSE (16), KV_GB (3), STEPS (16), WARMUP (6), CONTEXT (7800), QWEN_N (44),
# QWEN_CONTEXT (16384), QWEN_MODEL (qwen3-8b), QWEN_GB (52), SPEC_ACCEPT (a JSON acceptance for the Qwen runs).
DEADLINE_S=${DEADLINE_S:-570}
DEVICE=${DEVICE:-cuda}
DTYPE=$([ "$DEVICE" = cpu ] && echo float32 || echo bfloat16)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  say "pytest -m gpu (spec pipeline)"
  if [ "$DEVICE" = cpu ]; then export OASIS_GPU_TESTS_DEVICE=cpu; fi
  TEST_S=${TEST_S:-120} gpu_tests tests/gpu/test_spec_pipeline_gpu.py tests/gpu/test_exec_gpu.py \
    tests/unit/test_kernels_spec_repair.py -k "spec or beside"
fi

if [ "${SKIP_SMOL:-0}" != 1 ]; then
  need_model || exit 1
  smol() {  # MODE N SPEC_PREDICT KS...
    local mode=$1 n=$2 sp=$3; shift 3
    local T; T=$(min $(( $(left) - ${QWEN_RESERVE_S:-280} )) ${SMOL_RUN_S:-90})
    [ "$T" -lt 20 ] && { say "no time left for smol $mode $sp"; return; }
    # shellcheck disable=SC2086
    timeout -k 10 "$T" $PY experiments/speculative_decoding/spec_study.py --device "$DEVICE" --dtype "$DTYPE" \
      --model-path "$M" --modes "$mode" --contexts "${CONTEXT:-7800}" --ks "$@" --concurrency "$n" \
      --steps "${STEPS:-16}" --warmup "${WARMUP:-6}" --spec-predict "$sp" --kv-budget-gb "${KV_GB:-3}" \
      --out "$OUT/smol.jsonl" 2>&1 | grep -v -e Warning -e warn | tee -a "$OUT/smol.log" | tail -6
  }
  say "SmolLM2 at ${CONTEXT:-7800} tokens, ${KV_GB:-3} GB, on $DEVICE $DTYPE (left $(left)s)"
  smol lookahead "${N_LOOK:-64}" after 0 1 2
  smol lookahead "${N_LOOK:-64}" beside 1 2
  smol dense "${N_DENSE:-16}" after 0 1
fi

if [ "${SKIP_QWEN:-0}" != 1 ]; then
ACC=${SPEC_ACCEPT:-$($PY - <<'PY'
import json
recs = [json.loads(l) for l in open("experiments/speculative_decoding/results/h200_2868b70/spec_h200.jsonl")]
r = [r for r in recs if r["mode"] == "lookahead" and r["speculative_k"] == 1 and r["context"] == 7800][0]
print(json.dumps(r["accepted_hist"]))
PY
)}
QM=${QWEN_MODEL:-qwen3-8b}
if [ "$DEVICE" = cpu ]; then QARGS=(--record-hardware h200 --kv-budget-gb 1 --top-k 8); else QARGS=(--kv-budget-gb "${QWEN_GB:-52}"); fi
say "Qwen3-8B-shape dummy, lookahead, ${QWEN_CONTEXT:-16384} x ${QWEN_N:-44}, acceptance $ACC (left $(left)s)"
for run in ${QWEN_RUNS:-k0 k1_after k1_beside k0_nt k1_beside_nt}; do
  EXTRA=()
  W=${WARMUP:-6}
  case $run in *@*) W=${run#*@} ;; esac  # NAME@W: that run's warm-up steps
  case ${run%@*} in
    k0) EXTRA=(--speculative-k 0) ;;
    k0_nt) EXTRA=(--speculative-k 0 --no-transfer) ;;
    k1_after) EXTRA=(--speculative-k 1 --synthetic-accept "$ACC" --spec-predict after) ;;
    k1_after_nt) EXTRA=(--speculative-k 1 --synthetic-accept "$ACC" --spec-predict after --no-transfer) ;;
    k1_beside) EXTRA=(--speculative-k 1 --synthetic-accept "$ACC" --spec-predict beside) ;;
    k1_beside_nt) EXTRA=(--speculative-k 1 --synthetic-accept "$ACC" --spec-predict beside --no-transfer) ;;
  esac
  T=$(min $(( $(left) - 15 )) ${QWEN_RUN_S:-100})
  [ "$T" -lt 30 ] && { say "no time left for the qwen $run run"; break; }
  timeout -k 10 "$T" $PY -m oasis_exec bench --model "$QM" --dummy --device "$DEVICE" --dtype "$DTYPE" \
    --mode lookahead --context "${QWEN_CONTEXT:-16384}" --concurrency "${QWEN_N:-44}" --steps "${STEPS:-16}" \
    --warmup "$W" --selection synthetic --synthetic '{"preset": "smollm2"}' --no-host-fill \
    "${EXTRA[@]}" "${QARGS[@]}" --record "$OUT/qwen_${run/@/_w}.json" 2>> "$OUT/qwen.log" \
    | $PY -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l); r["run"] = sys.argv[1]; print(json.dumps(r))' "$run" | tee -a "$OUT/qwen.jsonl" | cut -c1-300
done
fi

$PY - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
smol, qwen = load("smol.jsonl"), load("qwen.jsonl")
print(f"# spec_predict beside / after / no speculation ({os.environ.get('OASIS_COMMIT')}, {smol[0]['device'] if smol else ''})\n")
if smol:
    print("## SmolLM2-135M (real weights, selection model, acceptance model), "
          f"{smol[0]['context']} tokens, {smol[0].get('kv_budget_gb')} GB GPU KV\n")
    print("| mode | spec_predict | k | requests | tok/s | TPOT p50 ms | tokens a step | repaired lane-steps | vs lookahead k=0 | vs dense best k>0 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = [r for r in smol if r["mode"] == "lookahead" and r["speculative_k"] == 0]
    dense = [r for r in smol if r["mode"] == "dense" and r["speculative_k"] != 0]
    b = base[0]["throughput_tok_s"] if base else None
    d = max((r["throughput_tok_s"] for r in dense), default=None)
    for r in smol:
        rep = f"{r.get('spec_predict_repairs')}/{r.get('spec_predict_lane_steps')}" if "spec_predict_repairs" in r else ""
        t = r["throughput_tok_s"]
        print(f"| {r['mode']} | {r.get('spec_predict') or '-'} | {r['speculative_k']} | {r['concurrency']} | {t:,.0f} | "
              f"{r['tpot_ms_p50']:.2f} | {r['accepted_tokens_per_step']:.2f} | {rep} | "
              f"{t / b if b else float('nan'):.2f}x | {t / d if d else float('nan'):.2f}x |")
if qwen:
    by = {r["run"]: r for r in qwen}
    print(f"\n## Qwen3-8B shape (dummy weights, selection synthetic smollm2, acceptance synthetic from the real head's "
          f"histogram), {qwen[0]['context']} x {qwen[0]['concurrency']}, {qwen[0].get('kv_budget_gb')} GB\n")
    print("| run | tok/s | TPOT p50 ms | step p50 ms | tokens a step | vs k=0 | overlap (TPOT / no-transfer twin) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    twin = {"k0": "k0_nt", "k1_after": "k1_after_nt", "k1_beside": "k1_beside_nt"}
    for name, r in by.items():
        base, at, w = name.partition("@")  # NAME@W: compared with the runs of the same warm-up
        k0 = by.get("k0" + at + w, {}).get("throughput_tok_s")
        tw = by.get(twin.get(base, "") + at + w)
        ov = f"{r['tpot_ms_p50'] / tw['tpot_ms_p50']:.3f}" if tw else ""
        print(f"| {name} | {r['throughput_tok_s']:,.0f} | {r['tpot_ms_p50']:.2f} | {r.get('step_ms_p50') or 0:.2f} | "
              f"{r['accepted_tokens_per_step']:.2f} | {r['throughput_tok_s'] / k0 if k0 else float('nan'):.2f}x | {ov} |")
PY
pack_out summary.md qwen.jsonl smol.jsonl pytest_gpu.txt progress.log  # a call brings back 8 files: the rest in all.tgz
say done
