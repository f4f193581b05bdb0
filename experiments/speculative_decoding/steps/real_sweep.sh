# Issue 18 on one H200 with the real model (SmolLM2-135M, real weights, its trained EAGLE-3 head, model selections),
# right after a call that assembled the model (/tmp/m/model.gguf, e.g. dense_vs_lookahead_throughput/baselines_more):
#   OASIS_COMMIT=<sha> bash experiments/device.sh speculative_decoding/real_sweep
# 1. GPU tests: speculative greedy == transformers' greedy (tie rule) in dense and lookahead, the hisparse and fp8
#    host-copy tests                                                                          -> pytest_gpu.txt
# 2. bench per mode (dense, lookahead) at 4,096 (K = 32) and 7,936 (K = 64) tokens x 16 requests, prompts cut from
#    traces/texts/argparse.py.txt: k = 0 with CUDA graphs, k = 0 eager (speculative steps run eagerly), k = 2,
#    k = auto                                                                                   -> spec_h200.jsonl
DEADLINE_S=${DEADLINE_S:-400}
need_model || exit 1
DRAFT=experiments/trained_draft_head/smollm2-eagle3
say "1. pytest -m gpu"
TEST_S=${TEST_S:-140} gpu_tests tests/gpu/test_real_model_gpu.py tests/gpu/test_exec_gpu.py -k "speculative or hisparse or fp8"
for ctx_k in "4096 32" "7936 64"; do  # 7,936: the decode room of k = auto fits the model's 8,192 positions
  set -- $ctx_k
  for mode in dense lookahead; do
    for spec in "0" "0 --no-cuda-graph" "2" "auto"; do
      T=$(min 50 $(( $(left) - 5 )))
      [ "$T" -lt 25 ] && { say "no time for $mode ctx=$1 k=$spec"; continue; }
      set -- $1 $2 $spec
      say "2. $mode ctx=$1 K=$2 k=$3 ${4:-}"
      timeout -k 5 "$T" $PY -m oasis_exec bench --model-path "$M" --draft-path $DRAFT --mode $mode --context "$1" \
        --concurrency 16 --max-lanes 16 --top-k "$2" --steps 24 --warmup 4 --prompt-text traces/texts/argparse.py.txt \
        --speculative-k "$3" ${4:-} --out "$OUT/spec_h200.jsonl" > "$OUT/spec_${mode}_$1_$3${4:+_eager}.log" 2>&1 \
        || say "failed: $(tail -2 "$OUT/spec_${mode}_$1_$3${4:+_eager}.log" | cut -c1-300)"
      set -- $1 $2
    done
  done
done
$PY - "$OUT/spec_h200.jsonl" <<'PY' | tee "$OUT/spec_h200.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| mode | context | k | graphs | tokens/step | tok/s | step p50 ms | per-token TPOT ms (step / tokens) |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    tps, acc = r["throughput_tok_s"], r.get("accepted_tokens_per_step") or 1.0
    print(f"| {r['mode']} | {r['context']} | {r['speculative_k']} | {r.get('cuda_graph')} | {acc:.2f} | {tps:.0f} "
          f"| {r['tpot_ms_p50']:.2f} | {r['tpot_ms_p50'] / acc:.2f} |")
PY
say "done"
