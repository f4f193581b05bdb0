# Issue 17, after figures_topk_vllm at f42f4b0 (16K 2.58x, 32K 3.35x vLLM; overlap 1.129 at 44, 1.120 at 16; one
# 16K x 16 run slow again, 16.88 ms, the first 16K x 16 run after a 32K run with copies). Three questions, one call:
# (1) the "K and V contiguous" lever: can the copy engines, fed one host-made list a layer (cuMemcpyBatchAsync),
#     gather 4-64 KiB pieces at more than the UVA gather's 45-46 GB/s? (experiments/transfer_paths/ce_batch_pieces.py)
# (2) copy_graph=on (a layer's copy may run on into the next step) against the step's own graph (off, the table's
#     choice since 7e41f72, measured before the top-K ran in the prediction) at 16K x 44, 16K x 16, 32K x 22;
# (3) the slow 16K x 16 run: every point twice, with no no-transfer twin between 32k-lookahead-22-r2 and
#     16k-lookahead-16-r2, so a 16K x 16 run directly follows a 32K run with copies in both passes.
# Then a profile of the default step at 16K x 44 with copies (where its 1.75 ms over the twin goes), if time is left.
# Predictions: (1) 4 KiB pieces well below 45 GB/s, 8 KiB below the large-piece 53-54 GB/s, 32-64 KiB near it;
# (2) copy_graph on within +-3% of off at 44 (the link binds), up to 0.3 ms faster at 16 (the 0.32 ms gather tail);
# (3) a 16K x 16 run after a 32K run with copies is slow (>= 15 ms) in both passes.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/pieces_order_copy_graph
# Ran at 81463a5 (results/pieces_order_copy_graph_81463a5/): 8 KiB pieces 16.9 GB/s; copy graphs 22% slower at 44;
# the slow run not triggered. All three predictions wrong in part (README there).
DEADLINE_S=${DEADLINE_S:-560}
SYN=${SYN:-'{"preset": "smollm2"}'}
say "copy-engine batches by piece size"
timeout -k 5 120 $PY experiments/transfer_paths/ce_batch_pieces.py --out "$OUT/ce_batch_pieces.json" \
  > "$OUT/ce_batch_pieces.log" 2>&1 || say "ce_batch_pieces failed: $(tail -2 "$OUT/ce_batch_pieces.log")"
grep -E '"kind"' "$OUT/ce_batch_pieces.log" | cut -c1-260
B=$(( $(left) - 110 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=44,16;32k=22' --max-n none \
  --nt-n '16k=44,16' --sens-n '16k=44,16;32k=22' --variants 'set=copy_graph:on' --anchors none --repeat 2 \
  --synthetic-work model --exec decode_chain=8 --budget-s "$B" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 \
  | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
$PY experiments/dense_vs_lookahead_throughput/baselines_table.py "$OUT" > "$OUT/baselines.md" 2>&1; cat "$OUT/baselines.md"
T=$(min 100 $(( $(left) - 5 )))
if [ "$T" -ge 80 ]; then
  say "profile 16K x 44"
  timeout -k 5 "$T" $PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill \
    --synthetic "$SYN" --top 30 --steps 2 --out "$OUT/profiles.jsonl" --mode lookahead --context 16384 \
    --concurrency 44 --exec synthetic_ahead=64 --exec synthetic_topk=true \
    --trace-out "$OUT/la44.json.gz" > "$OUT/profiles.txt" 2>&1 || say "profile failed: $(tail -1 "$OUT/profiles.txt")"
  $PY experiments/decode_step_profile/critical_path.py "$OUT/la44.json.gz" > "$OUT/critical_path.txt" 2>&1
  rm -f "$OUT"/*.json.gz
fi
say "done"
pack_out baselines.md progress.log ce_batch_pieces.json  # a call brings back 8 files: the rest in all.tgz
