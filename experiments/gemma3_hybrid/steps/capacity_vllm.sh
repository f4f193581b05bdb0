# Issue 36: the capacity story on real weights -- Gemma 3 270M at 32K, one 3 GB KV budget: vLLM 0.26 dense on the
# same GGUF (its hybrid allocator keeps the sliding windows) against OasisKV dense (rings for the 15 sliding layers,
# pages for the 3 full ones) and lookahead at K = 128 and 256 blocks, S = K (--hot-slots K) and a victim cache
# (--hot-slots 3K), plus the no-transfer twin of S = K. Weights: real; prompts: real text (--prompt-text
# traces/texts/argparse.py.txt, wrapped to 32,000 tokens, a different offset a request) prefilled for real, so the
# selections are the model's own (--selection model). Draft: no head is trained for Gemma (the lookahead's draft head
# is the engine's default, random: its draft token is noise, so the next step's prediction is the proxy's at best and
# the bytes a step are an upper bound of a trained head's). Bench records (tok/s, TPOT, bytes a step) in
# $OUT/oasis.jsonl.
# Carry the model's pieces (.models/a .. .models/h, `stash`ed back to back, see greedy_long.sh) and the vLLM bundle
# (.vb/1 .. .vb/3: dense_vs_lookahead_throughput/vllm_setup.sh), then, in one call (the parts as arguments, default
# all; PARTS that no longer fit the call's time are skipped with a line, so run the rest in a second call:
# `... capacity_vllm la256`):
#   OASIS_COMMIT=<sha> MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
#     bash experiments/device.sh gemma3_hybrid/capacity_vllm [vllm] [dense] [dense_plain] [la128|la128_s|la128_s_nt|la128_victim] [la256...]
# A part is a K (`la128`) or one run of it (`la128_s_nt`). First run 2026-12-05 at f174fe6
# (results/capacity_vllm_f174fe6/, 2,048-token chunks): vllm + dense took 214 s and a lookahead run ~200 s. Expected lanes at 32,000 tokens and 3 GB (bf16; lane bytes
# as kv/layout.py counts them since 55e0f04): dense 28 (106.4 MB: 2,004 blocks of full-layer pages + the rings);
# lookahead K = 128, S = K: 20.4 MB a lane (3 rows x 130 slots x 16 KiB, 2,004 blocks of summaries x 3 KB, the rings
# of 513 tokens), 146 lanes, so N = 128 requests run; S = 3K: 33.0 MB, 90 lanes; K = 256: 26.7 MB, 112 lanes;
# S = 3K: 51.9 MB, 57 lanes. vLLM 0.26 at 3 GB held 16 requests at 3,684 tok/s (H200, 2026-12-04).
# Measured 2026-12-06 at 450ffe2 (H100, results/capacity_vllm_450ffe2/): the lane counts exactly as above; with
# PREFILL_CHUNK=8192 (now the default) a lookahead run took 57-101 s, and `VLLM_CONC=16 PER_RUN_S=150 MIN_RUN_S=60
# DEADLINE_S=585` fit vLLM, dense and five lookahead runs in one call (521 s); `la256_s_nt la256_victim` ran in a
# second call right after.
DEADLINE_S=${DEADLINE_S:-590}
CTX=${CTX:-32000}
BUDGET=${BUDGET:-3}
PARTS=${*:-vllm dense la128 la256}
need_model || exit 1
part() { [[ " $PARTS " == *" $1 "* ]]; }
if part vllm; then
  . experiments/dense_vs_lookahead_throughput/vllm_setup.sh
  vllm_run gemma 200 --gguf "$M" --ctx "$CTX" --conc "${VLLM_CONC:-16,32}" --kv-bytes "${BUDGET}e9"
fi
run() {  # NAME BENCH-ARGS...: one bench record into $OUT/oasis.jsonl
  local name=$1; shift
  # a run is its real prefill + build + steps. Prefill at 2,048-token chunks (2026-12-05, H200): 35K tokens/s, 128 x
  # 32,000 tokens ~120 s; at 8,192 (2026-12-06, H100, 450ffe2): 59K tokens/s, 48-69 s (a CPU profile counts ~516 aten
  # ops a layer and chunk whatever its length: a host-bound prefill gains from longer chunks). On the compute-bound
  # CPU 8,192-token chunks are the slower (8K bench, 478c4b2: 115 s against 80 s), so CPU runs may set 2048.
  local t; t=$(min "${PER_RUN_S:-150}" "$(( $(left) - 20 ))")
  if [ "$t" -lt "${MIN_RUN_S:-60}" ]; then say "no time left for OasisKV $name (run it in another call)"; return; fi
  say "OasisKV $name: $*"
  timeout -k 10 "$t" $PY -m oasis_exec bench --model-path "$M" --device cuda --context "$CTX" \
    --kv-budget-gb "$BUDGET" --prefill-chunk "${PREFILL_CHUNK:-8192}" --concurrency "${N:-128}" --steps "${STEPS:-24}" --warmup 4 --selection model \
    --prompt-text traces/texts/argparse.py.txt "$@" --out "$OUT/oasis.jsonl" > "$OUT/bench_$name.log" 2>&1 \
    || say "$name failed: $(tail -2 "$OUT/bench_$name.log" | cut -c1-300)"
}
part dense && run dense --mode dense
part dense_plain && run dense_plain --mode dense --no-fused-ops  # the plain torch ops: the same-machine baseline
for K in 128 256; do
  for v in s s_nt victim; do  # a part names a K (la128: its three runs) or one run (la128_s_nt)
    part "la$K" || part "la${K}_$v" || continue
    case $v in
      s) extra=(--hot-slots "$K") ;;
      s_nt) extra=(--hot-slots "$K" --no-transfer) ;;
      victim) extra=(--hot-slots "$(( 3 * K ))") ;;
    esac
    run "la${K}_$v" --mode lookahead --top-k "$K" "${extra[@]}"
  done
done
tail -n +1 "$OUT"/bench_*.log > "$OUT/bench.log" 2>&1 && rm -f "$OUT"/bench_*.log
say "done"
pack_out progress.log oasis.jsonl vllm_gemma.json
