# Issue 17, call C: decode chains (ExecConfig.decode_chain: ordinary steps back to back on the device, one host read
# a chain) and the draft launch no longer held by a blocking host-to-device copy, against vLLM dense in ONE call.
# Qwen3-8B shape, dummy weights, 52 GB KV budget, synthetic selection of the smollm2 preset, top-K 128, fetch 0.05.
#   before: carry .vb/1, .vb/2, .models/a, .models/c, each `bash experiments/device.sh stash`
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/decode_chain   (carry .vb/3 .models/b)
# 0. GPU tests: test_exec_gpu.py (the chain in graphs; graphs = eager; speculative graphs) and the real model's
#    speculative / graph tests                                                              -> pytest_gpu.txt
# 1. vLLM dense bf16: 16K at 16 (its best at 3ca3b31), 32K at 10 (its most)               -> vllm_16384.json, vllm_32768.json
# 2. OasisKV (h200_headline, one pinned pool), decode_chain 8: lookahead 16K x 44 (the host's most) and 16, 32K x 22,
#    each with its no-transfer twin; the same points at decode_chain 1 (set=decode_chain:1)  -> oasis.jsonl, oasis.log
# 3. vLLM 16K at 21 if time is left; the ratios                                              -> baselines.md
# Prediction (written before the run, from the 055bdf9 profiles: graph spans 16.1 ms at 16K x 44, 12.2 ms at
# 32K x 22, the plain steps 2.2 ms longer): chain 8 -> ~16.5 ms a token at 16K x 44 (~2,670 tok/s, ~2.4x vLLM),
# ~12.5 ms at 32K x 22 (~1,760 tok/s, ~3.4x); the no-transfer twins shrink alike, so overlap stays ~1.13 at 44.
DEADLINE_S=${DEADLINE_S:-570}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
need_model || say "no real model: its GPU tests skip"
TEST_S=${TEST_S:-110} gpu_tests tests/gpu/test_exec_gpu.py tests/gpu/test_real_model_gpu.py
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -10
vllm_run 16384 100 --ctx 16384 --conc 16 --kv-bytes 52e9
vllm_run 32768 110 --ctx 32768 --conc 10 --kv-bytes 52e9
B=$(( $(left) - 90 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16;32k=22' --sens-n '16k=44,16;32k=22' --variants set=decode_chain:1 --anchors none \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
T=$(( $(left) - 8 ))
[ "$T" -gt 70 ] && vllm_run 16384_21 "$T" --ctx 16384 --conc 21 --kv-bytes 52e9
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
say "done"
