#!/usr/bin/env bash
# One H200 call (the second of two: the first copies .models/a/part_aa to /tmp/m): assemble SmolLM2's GGUF, install
# gguf, train the draft head (oasis_exec.draft_train) and smoke-test every mode on the GPU.
#   call 1 (carry .models/a): mkdir -p /tmp/m && cp .models/a/part_aa /tmp/m/
#   call 2 (carry .models/b): bash experiments/trained_draft_head/steps/train.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
[ -f /tmp/m/model.gguf ] || cat /tmp/m/part_aa .models/b/part_ab > /tmp/m/model.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/m/model.gguf" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .models/b/gguf-*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/device.txt"
cp .models/b/prompts.npz /tmp/m/prompts.npz
python3 -m oasis_exec.draft_train train --model-path /tmp/m/model.gguf --corpus /tmp/m/prompts.npz \
  --out "$OUT/smollm2-eagle3" ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log"
timeout 240 python3 experiments/trained_draft_head/smoke_gpu.py /tmp/m/model.gguf .models/b/GPL-3.txt \
  --draft-path "$OUT/smollm2-eagle3" 2>&1 | grep -v Warning | tee "$OUT/smoke.log"
