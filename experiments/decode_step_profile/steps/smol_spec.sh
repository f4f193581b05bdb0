# Issue 40: where SmolLM2's lookahead k = 1 step spends the ~2.2 ms it costs above k = 0 (real weights, 7,800
# tokens x 64, K = 64, 3 GB: k = 0 7.0 ms, k = 1 after 9.2 ms on the H100 at 65cbfb2, while dense k = 1 costs
# nothing above dense k = 0), and what the attention draft head costs (k = 0 7.0 ms against the single-key head's
# 4.2 ms at f8b34cd, before the ring kernel read its K/V). Dummy weights of SmolLM2's shape (timing only; no model
# to carry), synthesized prefill, the smollm2 synthetic selection, acceptance drawn from the real head's k = 1
# histogram at 65cbfb2 {"1": [461, 563]}, CUDA graphs, no decode chains. First the ring kernel's GPU test of the
# draft head's K/V read (tests/gpu/test_ring_attn_gpu.py).
#   OASIS_COMMIT=<hash> [RUNS='attn_k0 attn_k1 single_k0 single_k1 attn_k1_before'] bash experiments/device.sh decode_step_profile/smol_spec
#     -> smol_spec.jsonl, profile_*.txt, pytest_gpu.txt
# NAME_before runs NAME with the files carried under .before/ (the same paths) swapped in: a same-machine baseline.
DEADLINE_S=${DEADLINE_S:-540}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_S=90 gpu_tests tests/gpu/test_ring_attn_gpu.py
fi
ACC=${SPEC_ACCEPT:-'{"1": [461, 563]}'}
P=($PY experiments/decode_step_profile/step_profile.py --model smollm2-135m --context 7800 --concurrency 64
  --top-k 64 --kv-budget-gb 3 --no-host-fill --synthetic '{"preset": "smollm2"}' --synthetic-accept "$ACC"
  --warmup "${WARMUP:-8}" --top 50 --out "$OUT/smol_spec.jsonl")
RUN_S=${RUN_S:-120}
declare -A ARGS=(
  [attn_k0]="--speculative-k 0 --exec draft_head=attn"
  [attn_k1]="--speculative-k 1 --exec draft_head=attn"
  [single_k0]="--speculative-k 0"
  [single_k1]="--speculative-k 1"
  [attn_k1_beside]="--speculative-k 1 --exec draft_head=attn --exec spec_predict=beside"
)
for name in ${RUNS:-attn_k0 attn_k1 single_k0 single_k1}; do
  base=${name%_before}
  if [ "$base" != "$name" ]; then  # NAME_before: NAME with the files under .before/ (carried) swapped in
    [ -d .before ] || { say "no .before/ for $name"; continue; }
    rm -rf /tmp/now && mkdir -p /tmp/now && (cd .before && find . -type f) > /tmp/now/list
    while read -r f; do mkdir -p "/tmp/now/$(dirname "$f")"; cp "$f" "/tmp/now/$f"; cp ".before/$f" "$f"; done < /tmp/now/list
    # shellcheck disable=SC2086
    profile_run "$name" ${ARGS[$base]}
    while read -r f; do cp "/tmp/now/$f" "$f"; done < /tmp/now/list
  else
    # shellcheck disable=SC2086
    profile_run "$name" ${ARGS[$name]}
  fi
  grep -m1 "host wall" "$OUT/profile_$name.txt"
done
say "done"
