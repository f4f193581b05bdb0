# Issue 17, measurement hygiene: a 16K x 16 run with copies was slow throughout (+5-7 ms a token) once in each of four
# calls; at 2746686 and f42f4b0 it was `16k-lookahead-16-set=topk_kernel:sort` right after `32k-hisparse-22`.
# pieces_order_copy_graph_81463a5 showed that following a 32K run with copies is not enough. Here exactly that
# adjacency, twice (--repeat 2), nothing else: 32k-22, 16k-16, their sort variants and hisparse.
# Prediction: 16k-lookahead-16-set=topk_kernel:sort slow (>= 15 ms) in both passes; every other run normal.
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/slow_run_after_hisparse
# Not yet run (written 2026-12-02; the session's device time ran out at 07b2e8b).
DEADLINE_S=${DEADLINE_S:-170}
SYN=${SYN:-'{"preset": "smollm2"}'}
timeout -k 5 $(( $(left) - 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=16;32k=22' --max-n none --nt-n none \
  --sens-n '16k=16;32k=22' --variants 'set=topk_kernel:sort,mode=hisparse' --anchors none --repeat 2 \
  --exec decode_chain=8 --budget-s $(( $(left) - 15 )) --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 \
  | grep -v " plan " | tee "$OUT/oasis.log" | grep -E "done|skip|FAIL|fail|rror"
say "done"
