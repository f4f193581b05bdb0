# Issue 38: what each block scorer costs on the H200, at the headline shape (dummy Qwen3-8B, 16K x 44, lookahead,
# top-K 128, fetch 0.05, 52 GB, synthetic selection of the smollm2 preset: every kernel, the scoring included, runs
# for real; only the chosen ids come from the generator). No model pieces needed; nothing to carry.
#   OASIS_COMMIT=<sha> bash experiments/device.sh block_scorers/step_time     (one call, ~8 min)
# 1. the new kernels' tests compiled for the GPU (tests/unit/test_kernels_*scor*.py: CUDA when present) and the engine
#    with tokens on the GPU (tests/gpu/test_token_scorer_gpu.py: stored channels, graphs = eager, kernel = reference)
#                                                                                -> pytest_gpu.txt
# 2. the scoring kernel alone per scorer, 44 requests x 16K, 32 q / 8 KV heads, D 128 (one layer)
#                                                                                -> kernel.jsonl
# 2b. the per-token scorer's kernels (oasis_kernels/token_scorer.py: token_score, two launches) and its plain-torch
#    reference at the same shape, r = 32 (= D / 4, twice min/max's bytes) and 16 (= min/max's) -> kernel_tokens.jsonl
# 3. `tokens` against `minmax` inside the engine at 16K x 44 (issue 38's third goal): the same 384 slots a row (the
#    victim cache of 3 x K) and a budget that holds 44 lanes of either (56 GB: minmax 1.07 GB a lane, tokens 1.23 at
#    r = 32), minmax / tokens r = 32 / tokens r = 16 / minmax. Dummy Qwen3-8B has no fitted basis: the engine keeps
#    the first r / 2 RoPE pairs (i, i + 64) of every head (ExecConfig.token_basis None, oasis_core.token_scorer.
#    first_pairs); random weights score any r channels at the same cost, and the selection is synthetic anyway.
#    At the headline 52 GB, 44 lanes of 384 slots do not fit with tokens r = 32 (42 do): the victim cache would fall
#    to K slots, a memory cost, not the scorer's time; so the budget is raised for both   -> bench_tokens.jsonl
# 4. the decode step per two-vector scorer (bench: tok/s, TPOT; same seed and selections), minmax first and last
#                                                                                -> bench.jsonl, bench_*.log
# 5. kernel profiles of the step: minmax, tokens (56 GB, 384 slots) and minmax_sum+sink  -> profile_*.txt, profile.jsonl
# The files but progress.log and the JSONs go into all.tgz (a call brings back 8 files).
DEADLINE_S=${DEADLINE_S:-570}
SYN=${SYN:-'{"preset": "smollm2"}'}
SCORERS=${SCORERS:-"minmax minmax_sum+sink mean+sink gauss+sink minmax_sum"}
say "1. kernel tests on the GPU"
timeout -k 5 180 $PY -m pytest -q -n 0 tests/unit/test_kernels_block_scorers.py tests/unit/test_kernels_block_score.py \
  tests/unit/test_kernels_token_scorer.py tests/gpu/test_token_scorer_gpu.py \
  > "$OUT/pytest_gpu.txt" 2>&1; say "pytest rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"
say "2. the scoring kernel alone"
timeout -k 5 120 $PY - "$SCORERS" > "$OUT/kernel.jsonl" 2> "$OUT/kernel.err" <<'PY'
import json, sys
from oasis_kernels.block_scorers import bench_block_score_any
for s in sys.argv[1].split():
    print(json.dumps(bench_block_score_any(s, batch=44, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384)))
PY
say "kernel rc=$? $(cat "$OUT/kernel.jsonl" | cut -c1-160)"
say "2b. the per-token scorer's kernels"
timeout -k 5 90 $PY - > "$OUT/kernel_tokens.jsonl" 2> "$OUT/kernel_tokens.err" <<'PY'
import json
from oasis_kernels.token_scorer import bench_token_score
for r in (32, 16):
    print(json.dumps(bench_token_score(batch=44, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384, rank=r)))
PY
say "tokens rc=$? $(cut -c1-160 "$OUT/kernel_tokens.jsonl")"
BENCH=(-m oasis_exec bench --context 16384 --kv-budget-gb 52 --selection synthetic --synthetic "$SYN" --no-host-fill
  --transfer auto --top-k 128 --steps 24 --warmup 4 --mode lookahead --concurrency 44 --max-lanes 44)
say "3. tokens against minmax in the step at 16K x 44 (56 GB, 384 slots)"
for s in minmax tokens tokens:16 minmax; do
  T=$(min 75 $(( $(left) - 150 ))); [ "$T" -lt 30 ] && { say "no time for bench $s"; continue; }
  name=${s%%:*}; rank=0; [ "$s" != "$name" ] && rank=${s##*:}
  timeout -k 10 "$T" $PY "${BENCH[@]}" --kv-budget-gb 56 --hot-slots 384 --block-score "$name" --token-rank "$rank" \
    --out "$OUT/bench_tokens.jsonl" > "$OUT/bench_t_${s/:/_}.log" 2>&1
  say "bench $s rc=$? $(tail -c 200 "$OUT/bench_t_${s/:/_}.log" | tr '\n' ' ')"
done
say "4. the step at 16K x 44 per two-vector scorer"
for s in $SCORERS minmax; do
  T=$(min 75 $(( $(left) - 150 ))); [ "$T" -lt 30 ] && { say "no time for bench $s"; continue; }
  timeout -k 10 "$T" $PY "${BENCH[@]}" --block-score "$s" --out "$OUT/bench.jsonl" > "$OUT/bench_${s/+/_}.log" 2>&1
  say "bench $s rc=$? $(tail -c 200 "$OUT/bench_${s/+/_}.log" | tr '\n' ' ')"
done
say "5. profiles"
for s in minmax tokens minmax_sum+sink; do
  T=$(min 60 $(( $(left) - 15 ))); [ "$T" -lt 30 ] && { say "no time for profile $s"; continue; }
  budget=52; [ "$s" = tokens ] && budget=56  # 44 lanes of 384 slots (step 3)
  timeout -k 5 "$T" $PY experiments/decode_step_profile/step_profile.py --mode lookahead --context 16384 \
    --concurrency 44 --kv-budget-gb $budget --no-host-fill --synthetic "$SYN" --top 30 --block-score "$s" \
    --out "$OUT/profile.jsonl" > "$OUT/profile_${s/+/_}.txt" 2>&1 || say "profile $s failed"
done
say "done"
pack_out progress.log pytest_gpu.txt kernel.jsonl kernel_tokens.jsonl bench_tokens.jsonl bench.jsonl profile.jsonl
