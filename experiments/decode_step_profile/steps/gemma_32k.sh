# Issue 39: where a Gemma 3 270M decode step at 32K spends its GPU time -- the capacity table's shapes
# (experiments/gemma3_hybrid/results/capacity_vllm_450ffe2/: dense 28 lanes 5.86 ms, lookahead K = 128 at 128 lanes
# 11.18 ms, K = 256 victim cache at 57 lanes 7.90 ms; the calibrated simulator says 2.3-3.6 ms). Dummy weights (the
# same shapes; no model to carry), synthesized prefill, the gemma3 synthetic selection, 3 GB of GPU KV, CUDA graphs;
# one graph a profiled step (decode chains off, so each kernel is seen once a step). Kernel tables by phase: the sliding
# layers' ring attention (kv/ring.py: a gather of each lane's ring and fp32 copies) is the first suspect, the dense
# path's paged attention at head_dim 256 the second. Since the ring kernel (oasis_kernels.ring_attn, on by default),
# la128torch reruns la128 with ring_kernel=false, the old path, as the same-machine baseline.
#   OASIS_COMMIT=<hash> [RUNS='la128 la128torch'] bash experiments/device.sh decode_step_profile/gemma_32k   -> gemma_32k.jsonl, profile_*.txt
DEADLINE_S=${DEADLINE_S:-540}
SYN=${SYN:-'{"preset": "gemma3"}'}
P=($PY experiments/decode_step_profile/step_profile.py --model gemma3-270m --context 32000 --kv-budget-gb 3
  --no-host-fill --synthetic "$SYN" --top 40 --out "$OUT/gemma_32k.jsonl")
declare -A ARGS=(
  [dense28]="--mode dense --concurrency 28"
  [la128]="--mode lookahead --top-k 128 --concurrency 128 --max-lanes 0"
  [la128nt]="--mode lookahead --top-k 128 --concurrency 128 --max-lanes 0 --no-transfer"
  [la256v]="--mode lookahead --top-k 256 --concurrency 57 --max-lanes 0 --exec hot_slots=768"
  # the sliding layers' torch path (gather + fp32 einsums) on the same machine: the baseline of oasis_kernels.ring_attn
  [la128torch]="--mode lookahead --top-k 128 --concurrency 128 --max-lanes 0 --exec ring_kernel=false"
)
for name in ${RUNS:-dense28 la128 la128nt la256v la128torch}; do
  # shellcheck disable=SC2086
  profile_run "$name" ${ARGS[$name]}
done
say "done"
