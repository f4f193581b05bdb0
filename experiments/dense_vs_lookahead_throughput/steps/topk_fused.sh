# Issue 17: the prediction's top-K in one launch (ExecConfig.topk_kernel=fused, oasis_kernels/topk_select.py) against the
# torch sort, in the model-selected step's work (h200_headline --synthetic-work model: sets drawn ahead, the top-K
# run). engine_choice_vllm_fed96a7 found the sort's ~12 kernels a layer cost 0.35 ms a 16K x 44 token without copies
# but 4.4 ms with them (2.9 ms at 16 requests): the copies wait for plans that wait for the top-K. Here, one call, no
# vLLM: the GPU tests of the kernel and of the engine with it, then 16K x 44, 16K x 16 and 32K x 22 with the sort
# (base), fused, and no top-K (synthetic_topk false: the generator-free bound), each with its no-transfer twin, every
# run twice (--repeat 2: 30 runs of 3-6 s); then
# profiles of the sort and the fused top-K at 16K x 16 with critical_path.py. Ran 2026-12-02 at 85a86bf (the fused
# kernel failed to compile on the GPU: results/topk_fused_85a86bf/) and at dd08326, the threshold select, with
# DEADLINE_S=415 and no vLLM pieces (results/topk_select_dd08326/).
# Carry .vb/3 after `stash` of .vb/1 and .vb/2: vLLM's bundle is unpacked during the tests (CPU only) and, if time is
# left, vLLM 16K x 16 runs last, so that the next call (figures 1 and 3) starts vLLM warm.
# Prediction: fused within 0.3 ms of no top-K with copies: 16K x 16 ~9.9 ms (1.06 of its twin), 16K x 44 ~15.3 ms.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/topk_fused
DEADLINE_S=${DEADLINE_S:-560}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_unpack &
timeout -k 5 60 $PY -m pytest -q -p no:cacheprovider tests/unit/test_kernels_topk_select.py > "$OUT/pytest_topk.txt" 2>&1
say "kernel against topk_blocks on the GPU: $(tail -1 "$OUT/pytest_topk.txt")"
TEST_S=90 gpu_tests tests/gpu/test_exec_gpu.py -k "topk or synthetic_sets"
wait  # the bundle's unpacking (CPU) ends before any timed run
B=$(( $(left) - 150 ))
say "OasisKV (budget ${B}s)"
V='set=topk_kernel:fused,set=no_transfer:true+topk_kernel:fused,set=synthetic_topk:false'
V="$V,set=no_transfer:true+synthetic_topk:false"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16;32k=22' --sens-n '16k=44,16;32k=22' --variants "$V" --anchors none --synthetic-work model --repeat 2 \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
P=($PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" --top 30
  --steps 2 --out "$OUT/profiles.jsonl" --mode lookahead --context 16384 --concurrency 16
  --exec synthetic_ahead=64 --exec synthetic_topk=true)
for kern in sort fused; do
  T=$(min 60 $(( $(left) - 10 ))); [ "$T" -lt 30 ] && { say "no time for the $kern profile"; continue; }
  say "profile $kern"
  echo "#### $kern" >> "$OUT/profiles.txt"
  timeout -k 5 "$T" "${P[@]}" --exec topk_kernel=$kern --trace-out "$OUT/$kern.json.gz" >> "$OUT/profiles.txt" 2>&1 \
    || say "failed: $kern"
  $PY experiments/decode_step_profile/critical_path.py "$OUT/$kern.json.gz" >> "$OUT/critical_path.txt" 2>&1
done
T=$(( $(left) - 5 )); [ "$T" -ge 150 ] && vllm_run 16384 "$T" --ctx 16384 --conc 16 --kv-bytes 52e9
[ -f "$OUT/vllm_16384.log" ] && { tail -n 40 "$OUT/vllm_16384.log" > "$OUT/vllm.log"; rm -f "$OUT/vllm_16384.log"; }
say "done"
pack_out baselines.md progress.log critical_path.txt  # a call brings back 8 files: the rest in all.tgz
