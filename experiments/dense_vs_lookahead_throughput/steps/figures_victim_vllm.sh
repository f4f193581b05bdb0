# Issue 17, figures 1 and 3 in one call with vLLM, the victim cache (hot_slots=384, S = 3K) with plan_select's marks
# (ExecConfig.plan_marks, on by default since victim_lanes_f1fc382: 16K x 44 at 12.92 ms a token against 14.84 by
# compares; 16K x 48 at 13.98 ms, 3,430 tok/s, 3.07x vLLM's 1,117.9 of f42f4b0 across calls). Here: vLLM dense
# 16K x 16 and 32K x 10; OasisKV S = 3K at 16K x 48, 44, 16 and 32K x 22, each with its no-transfer twin, and
# S = K (hot_slots=128) at 16K x 44 and 32K x 22 (one pool pinned, the largest first). Carry .vb/3 after `stash` of .vb/1 and .vb/2 (vllm_setup.sh).
# Prediction: 16K x 48 S = 3K ~14.0 ms, >= 3.0x vLLM in the call; overlap <= 1.04 at 48, 44 and 16; 32K x 22
# S = 3K within 3% of S = K (the near-miss window ~320 is larger than the 256 extra slots).
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/figures_victim_vllm
DEADLINE_S=${DEADLINE_S:-580}
SYN=${SYN:-'{"preset": "smollm2"}'}
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_unpack
vllm_run 16384 200 --ctx 16384 --conc 16 --kv-bytes 52e9
vllm_run 32768 $(min 170 $(( $(left) - 200 ))) --ctx 32768 --conc 10 --kv-bytes 52e9
B=$(( $(left) - 25 ))
say "OasisKV (budget ${B}s)"
V=${VARIANTS:-set=hot_slots:128}
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=48,44,16;32k=22' --max-n none \
  --nt-n '16k=48,44,16;32k=22' --sens-n '16k=44;32k=22' --variants "$V" --anchors none --synthetic-work model \
  --exec decode_chain=8 --exec topk_kernel=fused --exec hot_slots=384 --budget-s "$B" --steps 24 --warmup 4 \
  --synthetic "$SYN" 2>&1 | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
tail -n +1 "$OUT"/vllm_*.log > "$OUT/vllm.log" 2>&1 && rm -f "$OUT"/vllm_*.log
say "done"
pack_out baselines.md progress.log oasis.jsonl
