# Issue 17: figures 1 and 3 with the engine's own transfer choice against vLLM dense in one call, and what the
# synthetic selection's own GPU work costs the measured step. Until f143ed3 h200_headline ran `--transfer uva`, 32
# programs, whatever the table said; now `auto` (the table; its 16-request entry is 16 programs since
# gather_launch_chain_f143ed3). chain_gaps_f143ed3 showed the synthetic generator busy ~3.4 ms a token on a side stream
# at 16K x 44, work a model-selected step does not do, while a model-selected step runs a top-K a layer that a
# synthetic one skips. Variants at 16K x 44, 16K x 16, 32K x 22, each with its no-transfer twin:
#   ahead+topk: sets drawn before the timed steps, the model's top-K run (ExecConfig.synthetic_ahead/_topk): the GPU
#               work of a model-selected step; ahead: the sets drawn before, no top-K (the generator's share alone);
#   8 and 32 programs (the old table entry at 16, the old headline default), and a repeat of the base (transfer:auto).
# vLLM dense 16K x 16 and 32K x 10 first. Carry .vb/3 after `stash` of .vb/1 and .vb/2 (vllm_setup.sh).
# Prediction: ahead alone cuts the no-transfer 16K x 44 token from ~14.8 to ~13.5 ms; the top-K adds back ~0.5 ms.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/engine_choice_vllm
DEADLINE_S=${DEADLINE_S:-570}
SYN=${SYN:-'{"preset": "smollm2"}'}
AH=synthetic_ahead:232  # (4 warm-up + 24 timed steps) x chain 8 = 224 passes' sets, and a few over
. experiments/dense_vs_lookahead_throughput/vllm_setup.sh
vllm_run 16384 160 --ctx 16384 --conc 16 --kv-bytes 52e9
vllm_run 32768 170 --ctx 32768 --conc 10 --kv-bytes 52e9
B=$(( $(left) - 15 ))
say "OasisKV (budget ${B}s)"
V="set=$AH+synthetic_topk:true,set=no_transfer:true+$AH+synthetic_topk:true,set=$AH,set=no_transfer:true+$AH"
V="$V,set=transfer:uva+uva_programs:8,set=transfer:uva+uva_programs:32,set=transfer:auto"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16;32k=22' --sens-n '16k=44,16;32k=22' --variants "$V" --anchors none --synthetic-work live \
  --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
  | tee "$OUT/oasis.log" | grep -E "done|skip|fail|error"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
tail -n +1 "$OUT"/vllm_*.log > "$OUT/vllm.log" 2>&1 && rm -f "$OUT"/vllm_*.log  # 8 files come back
say "done"
