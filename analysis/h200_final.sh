#!/usr/bin/env bash
# The last H200 call of 2026-11-30, in one command (device time left: ~650 s including the machine's start):
#   OASIS_COMMIT=<hash> bash analysis/h200_final.sh
# Sections in priority order, each under `timeout`, each continuing when the previous failed; budgets are taken
# from what is left of DEADLINE_S (seconds since the script started) so the whole ends inside the call's limit.
#   1. pytest -m gpu on the GPU-marked files                        -> $OUT/pytest_gpu.txt
#   2. analysis/h200_headline.py (issue 5 items 2 and 4, 16K, 52 GB) -> $OUT/headline.jsonl
#   3. analysis/record_matrix.py (issue 7 recordings)               -> $OUT/rec.tar.gz
# Progress lines with timestamps go to stdout and $OUT/progress.log.
set -u
DEADLINE_S=${DEADLINE_S:-440}
. "$(dirname "$0")/h200_lib.sh"  # OUT, PY, el/left/say/min, device_info

say "commit $OASIS_COMMIT"
device_info

# 1. GPU tests (run 4: 40 s for these files)
T1=$(min 85 $(( $(left) - 300 )))
say "1. pytest -m gpu (timeout ${T1}s)"
timeout -k 5 "$T1" $PY -m pytest -m gpu -q -x -p no:cacheprovider tests/test_exec_engine.py tests/test_exec_gpu.py \
  tests/test_kernels_block_score.py tests/test_kernels_gather.py tests/test_kernels_paged_attn.py \
  tests/test_kernels_sparse_attn.py tests/test_kernels_summary_update.py tests/test_policy_gpu.py \
  > "$OUT/pytest_gpu.txt" 2>&1
say "1. pytest rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"

# 2. Headline (resumes once if the process dies, e.g. killed while pinning)
for attempt in 1 2; do
  B=$(min 165 $(( $(left) - 140 )))
  [ "$B" -lt 20 ] && { say "2. no time left for the headline"; break; }
  say "2. headline attempt $attempt (budget ${B}s)"
  timeout -k 5 $(( B + 25 )) $PY -X faulthandler analysis/h200_headline.py --out "$OUT/headline.jsonl" \
    --budget-s "$B" --steps 12 --warmup 3 2>&1 | tee -a "$OUT/headline.log"
  rc=${PIPESTATUS[0]}
  say "2. headline rc=$rc"
  [ "$rc" = 0 ] && break
done

# 3. Recordings (cheapest first, budgeted, resumable; eager steps with per-stage CUDA events)
B=$(( $(left) - 12 ))
if [ "$B" -gt 30 ]; then
  say "3. record_matrix (budget ${B}s)"
  timeout -k 5 $(( B + 10 )) $PY -X faulthandler analysis/record_matrix.py --out "$OUT/rec" --budget-s "$B" \
    --steps 16 --warmup 3 --transfer uva --max-host-gb 40 --no-host-fill --prepin 2>&1 | tee -a "$OUT/rec.log"
  say "3. record_matrix rc=${PIPESTATUS[0]}: $(ls "$OUT/rec" 2>/dev/null | grep -c 'json$') files"
else
  say "3. no time left for recordings"
fi
[ -d "$OUT/rec" ] && tar czf "$OUT/rec.tar.gz" -C "$OUT" rec && rm -rf "$OUT/rec"
say "done"
