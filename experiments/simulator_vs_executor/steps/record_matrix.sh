# Recordings for the simulator check (the graph-mode H200 call of 2026-11-30, ~440 s of device time), in one command:
#   OASIS_COMMIT=<hash> bash experiments/device.sh simulator_vs_executor/record_matrix
# Sections in priority order, each under `timeout`, each continuing when the previous failed; budgets are taken
# from what is left of DEADLINE_S (seconds since the script started) so the whole ends inside the call's limit.
#   1. experiments/simulator_vs_executor/record_matrix.py --no-profile (the validation matrix, CUDA graphs on)  -> $OUT/rec.tar.gz
#      (retried once at --max-host-gb 40 when the process dies, e.g. killed while pinning; it resumes)
#   2. h200_headline.py --preset first-sensitivity (drift x2/x4, fetch 0.02/0.10)      -> $OUT/sensitivity.jsonl
# Progress lines with timestamps go to stdout and $OUT/progress.log; logs to $OUT/rec.log, $OUT/sensitivity.log.
DEADLINE_S=${DEADLINE_S:-262}


# 1. Recordings in graph mode (cheapest first, budgeted, resumable)
CAP=80
for attempt in 1 2; do
  B=$(min 150 $(( $(left) - 95 )))
  [ "$B" -lt 30 ] && { say "1. no time left for recordings"; break; }
  say "1. record_matrix --no-profile attempt $attempt (budget ${B}s, --max-host-gb $CAP)"
  timeout -k 5 $(( B + 15 )) $PY -X faulthandler experiments/simulator_vs_executor/record_matrix.py --out "$OUT/rec" --budget-s "$B" \
    --steps 24 --warmup 4 --transfer uva --max-host-gb $CAP --no-host-fill --prepin --no-profile --slowdown 1.5 \
    2>&1 | tee -a "$OUT/rec.log"
  rc=${PIPESTATUS[0]}
  say "1. record_matrix rc=$rc: $(ls "$OUT/rec" 2>/dev/null | grep -c 'json$') files"
  [ "$rc" = 0 ] && break
  CAP=40
done
[ -d "$OUT/rec" ] && tar czf "$OUT/rec.tar.gz" -C "$OUT" rec && rm -rf "$OUT/rec"

# 2. Sensitivity (resumes once if the process dies)
for attempt in 1 2; do
  B=$(min 100 $(( $(left) - 12 )))
  [ "$B" -lt 20 ] && { say "2. no time left for the sensitivity"; break; }
  say "2. sensitivity attempt $attempt (budget ${B}s)"
  timeout -k 5 $(( B + 10 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py --preset first-sensitivity --out "$OUT/sensitivity.jsonl" \
    --budget-s "$B" --steps 16 --warmup 4 2>&1 | tee -a "$OUT/sensitivity.log"
  rc=${PIPESTATUS[0]}
  say "2. sensitivity rc=$rc"
  [ "$rc" = 0 ] && break
done
say "done"
