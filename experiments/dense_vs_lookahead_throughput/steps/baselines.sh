# Issue 17, call A: vLLM 0.26 dense and OasisKV in ONE call on one H200 (two vLLM runs of one day differ by ~3%, so
# ratios come from one call). Qwen3-8B shape, dummy weights, 52 GB KV budget. Synthetic selection from the preset
# fitted to SmolLM2 (SYN, default '{"preset": "smollm2"}').
#   before: carry .vb/1, then .vb/2, each `bash experiments/device.sh stash` (../vllm_setup.sh says how they are built)
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/baselines     (carry .vb/3)
# 1. vLLM dense bf16: 16K at 21 (its most at 52 GB) and 16, 32K at 10                  -> vllm_16384.json, vllm_32768.json
# 2. OasisKV (h200_headline, one pinned pool): lookahead at 16K x 44 (the host's most) and 16, 32K x 22, each 16K point
#    with its no-transfer twin (the overlap figure), and the HiSparse-style baseline (mode=hisparse) at 16K x 44, 16
#                                                                                         -> oasis.jsonl, oasis.log
# 3. vLLM dense fp8 KV (e4m3): 16K at 42 (its most at 52 GB) and 21                    -> vllm_16384_fp8.json
# 4. the ratios                                                                          -> baselines.md
# Estimate: vLLM ~100 s a context (engine start ~75 s), OasisKV ~200 s (one 106 GB pool pinned once, ~40 s).
DEADLINE_S=${DEADLINE_S:-540}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_run 16384 170 --ctx 16384 --conc 21,16 --kv-bytes 52e9
vllm_run 32768 150 --ctx 32768 --conc 10 --kv-bytes 52e9
B=$(( $(left) - 130 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16' --sens-n '16k=44,16' --variants mode=hisparse --anchors none --budget-s "$B" \
  --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error" 
vllm_run 16384_fp8 $(min 150 $(( $(left) - 10 ))) --ctx 16384 --conc 42,21 --kv-bytes 52e9 --kv-cache-dtype fp8
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
