#!/usr/bin/env bash
# The real model on one H200, in calls back to back while the machine stays warm (it goes back 30 s after a call):
#   calls 1, 2 (carry .models/a, then .models/c): mkdir -p /tmp/m && cp .models/[ac]/p_a? /tmp/m/
#   call 3 (carry .models/b): STAGE=quality bash experiments/real_model_step_cost/steps/real_model.sh   # GPU tests, quality runs
#   call 4 (no carry):        STAGE=bench   bash experiments/real_model_step_cost/steps/real_model.sh   # five modes at 8K
# The GGUF goes in three 36 MB pieces (`split -b 36M FILE .models/p_`: p_aa in .models/a, p_ab in .models/c, p_ac
# with the gguf wheel in .models/b): with the trained head the working tree is 19 MB, and a call carries 64 MiB.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD OASIS_GGUF=/tmp/m/model.gguf
M=/tmp/m/model.gguf
DRAFT=experiments/trained_draft_head/smollm2-eagle3
T0=$(date +%s); say() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
if [ ! -f $M ]; then cat /tmp/m/p_aa /tmp/m/p_ab .models/b/p_ac > $M; fi
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $M" | sha256sum -c - || exit 1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .models/b/gguf-*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/device.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >> "$OUT/device.txt"
COMMIT=${OASIS_COMMIT:-unknown}
case "${STAGE:-quality}" in
quality)
  say "pytest -m gpu"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ 2>&1 | tail -15 > "$OUT/pytest_gpu.txt"; cat "$OUT/pytest_gpu.txt"
  say "quality selection"
  timeout ${SEL_S:-200} python3 -m oasis_exec quality selection --model-path $M \
    --texts GPL-3 MPL-2.0 Apache-2.0 argparse.py shlex.py --n-tokens 4096 8192 --k-frac 0.125 0.25 \
    --block-size 16 --positions 64 --drafts eagle3 ngram oracle random --draft-path $DRAFT \
    --device cuda --dtype bfloat16 --fit-draft eagle3 --commit $COMMIT \
    --out $OUT/quality_selection_h200_2026-12-01.json 2>&1 | tr '\r' '\n' | grep -v -e Warning -e clean_up \
    | tee $OUT/selection.log | tail -30
  say "quality endtoend"
  OUT=$OUT BUDGET_S=${E2E_BUDGET_S:-190} DRAFT=$DRAFT bash experiments/real_attention_quality/steps/endtoend.sh | tail -40
  say done ;;
bench)
  for mode in ${MODES:-lookahead dense proxy quest retrieval}; do
    say "bench $mode"
    timeout ${RUN_S:-120} python3 -m oasis_exec bench --model-path $M --mode $mode --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT --out "$OUT/bench_smollm2_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" || tail -5 "$OUT/bench.err"
  done
  for extra in ${EXTRAS:---no-transfer --profile}; do  # the overlap reference and the eager, profiled hidden fraction
    say "bench lookahead $extra"
    timeout ${RUN_S:-120} python3 -m oasis_exec bench --model-path $M --mode lookahead --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT $extra --out "$OUT/bench_smollm2_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" \
      || tail -5 "$OUT/bench.err"
  done
  for preset in ${PRESETS:-paper smollm2}; do
    say "bench lookahead synthetic $preset"
    timeout ${RUN_S:-120} python3 -m oasis_exec bench --model-path $M --mode lookahead --context 8096 --concurrency ${N:-32} \
      --max-lanes ${N:-32} --top-k ${K:-64} --steps ${STEPS:-32} --warmup ${WARMUP:-5} --prompt-text traces/texts/argparse.py.txt \
      --draft-path $DRAFT --selection synthetic --synthetic "{\"preset\": \"$preset\"}" \
      --out "$OUT/bench_smollm2_8k.jsonl" > /dev/null 2>> "$OUT/bench.err" || tail -5 "$OUT/bench.err"
  done
  python3 - "$OUT/bench_smollm2_8k.jsonl" <<'PY'
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
