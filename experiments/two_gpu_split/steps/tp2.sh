# Tensor parallelism on two H200s (kind nvidia-h200-x2; withheld when this was written, so never run yet). One call,
# nothing carried (dummy weights, synthetic selection):
#   OASIS_COMMIT=<sha> CUDA_VISIBLE_DEVICES=0,1 bash experiments/device.sh two_gpu_split/tp2
# With the real model for the GPU test too: `stash` calls for the GGUF's pieces first (experiments/README.md), then
# the same command (need_model finds them). Results: $OUT/pytest_gpu.txt, $OUT/tp_bench.jsonl, $OUT/tp_bench.txt.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); each rank owns one GPU (LOCAL_RANK), NCCL between them.
export CUDA_VISIBLE_DEVICES=0,1 NCCL_NVLS_ENABLE=0
DEADLINE_S=${DEADLINE_S:-570}
need_model || say "no real model: its GPU test skips"
say "pytest -m gpu: TP=2 equals TP=1 on two GPUs"
TEST_S=${TEST_S:-150} gpu_tests tests/gpu/test_tensor_parallel_gpu.py
# Qwen3-8B shape, 16K, dummy weights, synthetic selection at the fitted SmolLM2 preset; the 52 GB KV budget a GPU.
# TP=1 and TP=2 at the same concurrencies, each also a recording (rank 0's, with config.tensor_parallel): back on the
# CPU, `python -m oasis_sim validate OUT/rec` gives the simulator's error on every TP step time (it simulates rank 0's
# share of the model plus two NVLink all-reduces a layer, SimConfig.tensor_parallel).
mkdir -p "$OUT/rec"
for n in ${CONCS:-16 32}; do
  for tp in 1 2; do
    for mode in ${MODES:-lookahead dense}; do
      [ "$(left)" -lt 60 ] && { say "out of time before tp=$tp n=$n $mode"; break 3; }
      say "bench $mode tp=$tp n=$n"
      timeout $(min "$(left)" ${RUN_S:-150}) $PY -m oasis_exec bench --model qwen3-8b --dummy --mode $mode \
        --context 16384 --concurrency $n --kv-budget-gb 52 --steps ${STEPS:-32} --warmup ${WARMUP:-5} \
        --selection synthetic --synthetic '{"preset": "smollm2"}' --tensor-parallel $tp \
        --out "$OUT/tp_bench.jsonl" --record "$OUT/rec/${mode}_tp${tp}_n${n}.json" --record-hardware h200 \
        > /dev/null 2>> "$OUT/bench.err" || tail -5 "$OUT/bench.err"
    done
  done
done
$PY - "$OUT/tp_bench.jsonl" <<'PY' | tee "$OUT/tp_bench.txt"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['mode']:9s} tp={r['tensor_parallel']} n={r['concurrency']:3d} tok/s={r['throughput_tok_s']:8.1f} "
          f"tpot_p50={r['tpot_ms_p50']:.2f}ms bytes/step={r['bytes_moved_per_step'] / 1e6:.2f}MB "
          f"kv_heads/rank={[x['kv_heads'] for x in r.get('ranks', [r])]} graphs={r['copy_graph']} commit={r['commit']}")
PY
say done
