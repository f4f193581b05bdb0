# The latest headline (results/headline_52gb.md): the 52 GB headline at 16K and 32K with the engine's table (transfer=auto), the
# overlap twins at 16 and 64, and the drift x2/x4 and fetch 0.02/0.10 points at 48 and 64. On a 256 GiB host (kind
# nvidia-h200-x2, one GPU used), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/headline_52gb
# (CPU dry run of the plan: python experiments/dense_vs_lookahead_throughput/h200_headline.py --out /tmp/x.jsonl <the flags below> --dry-run
#  --assume-mem-gb 262)                                                                     -> headline.jsonl, .log
DEADLINE_S=${DEADLINE_S:-420}

B=$(( $(left) - 15 ))
say "headline (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py --out "$OUT/headline.jsonl" \
  --contexts 16k,32k --dense-n '16k=21,24;32k=10' --la-n '16k=16,48,64,80;32k=44' --max-n none \
  --nt-n '16k=16,64' --sens-n '16k=48,64' --anchors none --transfer auto --budget-s "$B" 2>&1 | grep -v " plan " \
  | tee "$OUT/headline.log"
say "done"
