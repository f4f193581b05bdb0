#!/usr/bin/env bash
# Issue 37 on the H200, one model a call (about 5-6 minutes each), from the repository root:
#   OASIS_COMMIT=<sha> bash experiments/long_context_draft/device_step.sh smollm2   # after `stash` of SmolLM2's pieces
#   OASIS_COMMIT=<sha> bash experiments/long_context_draft/device_step.sh gemma     # after `stash` of Gemma's pieces
# Each runs experiments/device.sh long_context_draft/train_<model> (steps/train_*.sh: the exact commands); results
# under $OUT: the head (safetensors + config.json with provenance + accept.json) and train.log.
set -uo pipefail
case "${1:-}" in
  smollm2) exec bash "$(dirname "$0")/../device.sh" long_context_draft/train_smollm2 ;;
  gemma) MODEL_DIR=${MODEL_DIR:-/tmp/mg} exec bash "$(dirname "$0")/../device.sh" long_context_draft/train_gemma ;;
  *) echo "usage: device_step.sh smollm2|gemma" >&2; exit 2 ;;
esac
