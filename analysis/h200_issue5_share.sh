#!/usr/bin/env bash
# Issue 5: the UVA gather with a host share (host_every: every N-th item of a layer's list by the host path's CPU
# gather + DMA, beside the gather), at the two concurrencies around the 16K peak; then the headline points with the
# table those runs write. On a 256 GiB host (kind nvidia-h200-x2, one GPU used), in one command:
#   cd .h200_src && OASIS_COMMIT=<hash> bash analysis/h200_issue5_share.sh
# 1. pytest: the executor's GPU tests (host share == UVA alone, slots == host pool) and the gather kernels -> pytest_gpu.txt
# 2. transfer_paths.py at 64/48: uva16 (copy graph, in the step's graph) and uva16 with 1/4, 1/8, 1/16 host shares
#                                                                                                 -> transfer_paths.jsonl
# 3. its summary on the device: a table of the 64 and 48 entries (the engine's other entries stay) -> transfer_table.json
# 4. h200_headline.py at 16K: dense 21, lookahead 48 and 64 with transfer=auto (that table)      -> headline.jsonl
set -u
DEADLINE_S=${DEADLINE_S:-430}
. "$(dirname "$0")/h200_lib.sh"  # OUT, PY, el/left/say/min, device_info

say "commit $OASIS_COMMIT"
device_info
say "1. pytest"
timeout -k 5 100 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_exec_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
say "1a. rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"
timeout -k 5 40 $PY -m pytest -q -p no:cacheprovider tests/test_kernels_gather.py >> "$OUT/pytest_gpu.txt" 2>&1
say "1b. rc=$? : $(tail -1 "$OUT/pytest_gpu.txt")"

B=$(min 170 $(( $(left) - 120 )))
say "2. transfer_paths (budget ${B}s)"
timeout -k 10 $(( B + 30 )) $PY -X faulthandler analysis/transfer_paths.py --out "$OUT/transfer_paths.jsonl" \
  --budget-s "$B" --concurrency 64,48 --programs 16 --threads '' --host-every 4,8,16 --share-threads 16 --in-graph \
  --steps 12 --warmup 3 2>&1 | grep -E "done|FAIL|budget" | cut -c1-150
say "2. rc=${PIPESTATUS[0]}"

say "3. summary -> oasis_exec/transfer_table.json (64 and 48 entries)"
$PY analysis/transfer_paths.py --summarize "$OUT/transfer_paths.jsonl" /tmp/tp_share \
  --table-out oasis_exec/transfer_table.json 2>&1 | tail -1
cp oasis_exec/transfer_table.json "$OUT/transfer_table.json"

B=$(( $(left) - 10 ))
say "4. headline (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler analysis/h200_headline.py --out "$OUT/headline.jsonl" \
  --contexts 16k --dense-n 21 --la-n '16k=48,64' --max-n none --nt-n none --sens-n none --anchors none \
  --transfer auto --budget-s "$B" 2>&1 | grep -v " plan " | tee "$OUT/headline.log"
say "done"
