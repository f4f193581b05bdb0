#!/usr/bin/env bash
# One H200 call: the end-to-end quality matrix of issue 13 (python -m oasis_exec quality endtoend) on SmolLM2-135M.
# The model arrives as in ../../../shared/models/README.md: /tmp/m/model.gguf already assembled by an earlier call of
# the same warm machine, or /tmp/m/part_aa (call 1: carry .models/a, `mkdir -p /tmp/m && cp .models/a/part_aa /tmp/m/`)
# plus .models/b/part_ab and the gguf wheel carried by this call.
#   OUT=...           results folder (the device call's $OUT)
#   BUDGET_S=190      no engine starts after this many seconds of the matrix (what is left is listed as skipped)
#   DRAFT=experiments/trained_draft_head/smollm2-eagle3   the trained head ("none": the random head)
#   E2E_ARGS=...      extra options (e.g. --quick, --drafts head oracle, --lengths 2048 8192)
#   OASIS_COMMIT=sha  the commit the results name (the device's copy has no git history)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/m
[ -f /tmp/m/model.gguf ] || cat /tmp/m/p_aa /tmp/m/p_ab .models/b/p_ac > /tmp/m/model.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/m/model.gguf" | sha256sum -c - || exit 1
python3 -c 'import gguf' 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site \
  .models/b/gguf-*.whl || exit 1
DRAFT=${DRAFT:-experiments/trained_draft_head/smollm2-eagle3}
DRAFT_ARGS=()
[ "$DRAFT" != none ] && DRAFT_ARGS=(--draft-path "$DRAFT")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/e2e_device.txt"
# 2K / 4K / 8K groups; dense, then every sparse mode at K = all blocks of the 2K group (must equal dense up to bf16
# rounding), then lookahead / proxy / quest / retrieval at K = 12.5% and 25%, fetch 0.05 first, then 0.02, 0.10, all.
timeout $(( ${BUDGET_S:-190} + 45 )) python3 -m oasis_exec quality endtoend --model-path /tmp/m/model.gguf \
  --device cuda "${DRAFT_ARGS[@]}" --full-k-check 2048 --time-budget-s "${BUDGET_S:-190}" \
  --out "$OUT/quality_endtoend_h200.json" ${E2E_ARGS:-} 2>&1 \
  | tr '\r' '\n' | grep -v -e Warning -e clean_up_tokenization | tee "$OUT/e2e.log" | grep -v -E 'engine(/s)?\]$'
echo "rc=${PIPESTATUS[0]}"
