#!/usr/bin/env bash
# The one device runner of the experiments. On the GPU machine, from the repository root, in one device call:
#
#   OASIS_COMMIT=<sha> bash experiments/device.sh <question>/<step> [ARG ...]
#
# sets up what every step needs, then sources experiments/<question>/steps/<step>.sh (ARGs become its "$@"):
#   - $OUT (default /tmp/out) made; results go under it; progress lines with timestamps to stdout and
#     $OUT/progress.log;
#   - PYTHONUNBUFFERED=1, PYTHONPATH=/tmp/site:$PWD, OASIS_COMMIT (the device's copy has no git history: pass the
#     commit the results will name), CUDA_VISIBLE_DEVICES=0 (one GPU, also on a machine with several);
#   - carried wheels installed into /tmp/site, once per machine: every .models/*/*.whl and $WHL/*.whl
#     (the GPU machine reaches no package registry);
#   - $OUT/device.txt: the step, commit, date, GPU, host memory and CPU, torch and Triton versions.
# Built-in steps (no file):
#   info    only the above (a cheap first call);
#   stash   copy the carried model pieces (.models/*/p_* and part_*) into $MODEL_DIR and the vLLM bundle's pieces
#           (.vb/*/v_??) into $VLLM_DIR, for a later call;
#   model   assemble and check the model (need_model below) and print its path.
# Steps may use: el (seconds since the start), left (seconds to $DEADLINE_S, which the step sets), say MSG,
#   min A B (integers), profile_run NAME ARGS (the step's profiler command P into $OUT/profile_NAME.txt), need_model (assemble $MODEL_DIR/model.gguf from its pieces if needed, check its sha256, export
#   OASIS_GGUF and M), gpu_tests [PYTEST ARGS] (pytest -m gpu into $OUT/pytest_gpu.txt), table_from RUNS PREFIX,
#   pack_out KEEP... (every other file under $OUT into $OUT/all.tgz: a call brings back 8 files at most).
# The real model's pieces: /work/shared/models/README.md (a call carries 64 MiB with the working tree, 30 MB since
# 2026-12-02, so the 98 MB GGUF is split with `split -b 26M FILE /tmp/p_` into .models/a .. .models/d, the gguf wheel
# (`pip download --no-deps gguf`) with the last; earlier calls `stash` theirs while the machine is warm).
# experiments/device_carry.sh prepares all of this here: `pieces gemma|smollm2`, `wheel`, `slim` / `unslim`.
# Fewer calls (2026-12-05): untrack the results, traces/public, experiments/trained_draft_head/prompts.npz and its
# model.safetensors for the calls (`git rm -r -q --cached` + the same paths in .git/info/exclude; `git reset` after,
# never commit meanwhile): the tree is then 6.7 MB and a call carries ~59 MB more, e.g. Gemma's 253 MB in five pieces
# (58 + 3 x 59.5 + 16.6 MB, named p_aa..p_ae in .models/a..e; export MODEL_SHA256=a5fd3b62...6818). A warm carry call
# costs ~10 s; a machine can be taken back mid-call, losing what was stashed.
# A CPU machine runs the same runner: steps that support it say how (e.g. serving_load/serve with DEVICE=cpu).
set -uo pipefail
usage() { echo "usage: bash experiments/device.sh <question>/<step> [ARG ...] | info | stash | model | --list" >&2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -lt 1 ]; then usage; exit 2; fi
STEP=$1; shift
if [ "$STEP" = --list ]; then
  (cd "$ROOT/experiments" && ls */steps/*.sh | sed 's|/steps/|/|; s|\.sh$||'); exit 0
fi
case "$STEP" in
  info|stash|model) STEP_FILE= ;;
  */*)
    if ! [[ "$STEP" =~ ^[a-z0-9_]+/[a-z0-9_]+$ ]]; then echo "device.sh: step must be <question>/<step>, got '$STEP'" >&2; exit 2; fi
    STEP_FILE="$ROOT/experiments/${STEP%%/*}/steps/${STEP##*/}.sh"
    if [ ! -f "$STEP_FILE" ]; then echo "device.sh: no step '$STEP' (no file experiments/${STEP%%/*}/steps/${STEP##*/}.sh; --list shows the steps)" >&2; exit 2; fi ;;
  *) echo "device.sh: unknown step '$STEP' (want <question>/<step>, info, stash or model)" >&2; exit 2 ;;
esac
cd "$ROOT"

OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL_DIR=${MODEL_DIR:-/tmp/m}
VLLM_DIR=${VLLM_DIR:-/tmp/vbx}  # stashed pieces of the vLLM bundle
SITE=${SITE:-/tmp/site}
CARRIED=${CARRIED:-.models}  # where a call's carried pieces and wheels are (the `carry` paths of the device tool)
MODEL_SHA256=${MODEL_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}  # SmolLM2-135M Q4_1
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$ROOT OASIS_COMMIT=${OASIS_COMMIT:-unknown}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
PY=${PY:-python3}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( ${DEADLINE_S:-560} - $(el) )); }  # a step sets DEADLINE_S (its default) first
say() { echo "[$(date -u +%H:%M:%S) +$(el)s] $*" | tee -a "$OUT/progress.log"; }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }

pack_out() {  # KEEP...: every other file under $OUT into $OUT/all.tgz (a device call brings back 8 files at most)
  local keep=() f; for f in "$@"; do keep+=(--exclude "./$f"); done
  (cd "$OUT" && tar czf /tmp/all.tgz "${keep[@]}" . && find . -type f $(printf "! -name %s " "$@") -delete \
    && mv /tmp/all.tgz all.tgz)
}

in_name_order() {  # PATHS...: the existing ones, one per file name, in name order (split names its pieces in order)
  ls "$@" 2>/dev/null | awk -F/ '{print $NF "\t" $0}' | sort -u -k1,1 | cut -f2
}
pieces() {  # the model's pieces, carried now or stashed earlier
  in_name_order "$MODEL_DIR"/p_?? "$MODEL_DIR"/part_?? "$CARRIED"/*/p_?? "$CARRIED"/*/part_??
}
need_model() {  # sets M and OASIS_GGUF; returns 1 (with a line) when the model cannot be assembled or is wrong
  M=$MODEL_DIR/model.gguf
  if [ ! -f "$M" ]; then
    local p; p=$(pieces)
    [ -z "$p" ] && { say "no model: neither $M nor pieces of it (.models/*/p_??, $MODEL_DIR/p_??)"; return 1; }
    mkdir -p "$MODEL_DIR"
    # shellcheck disable=SC2086
    cat $p > "$M.part" && mv "$M.part" "$M"
  fi
  if ! echo "$MODEL_SHA256  $M" | sha256sum -c --status - 2> /dev/null; then
    say "model $M: sha256 is not $MODEL_SHA256 (a piece missing or out of order?); removed"; rm -f "$M"; return 1
  fi
  export OASIS_GGUF=$M
  say "model $M: sha256 ok"
}
profile_run() {  # NAME ARGS...: "${P[@]}" ARGS (the step's profiler command) into $OUT/profile_NAME.txt, at most RUN_S
  # (150) seconds and the time left less 10; a failure is said with the file's last lines
  local name=$1 T; shift
  T=$(min "${RUN_S:-150}" $(( $(left) - 10 ))); [ "$T" -lt 40 ] && { say "no time for $name"; return; }
  say "profile $name: $*"
  timeout -k 5 "$T" "${P[@]}" "$@" > "$OUT/profile_$name.txt" 2>&1 || say "failed: $name $(tail -2 "$OUT/profile_$name.txt")"
}
gpu_tests() {  # [pytest args; default: every test file with GPU tests] -> $OUT/pytest_gpu.txt
  local files=("$@")
  [ ${#files[@]} -eq 0 ] && mapfile -t files < <(grep -rl --include="test_*.py" "mark.gpu" tests/ | sort)
  timeout -k 5 "${TEST_S:-150}" $PY -m pytest -q -m gpu -p no:cacheprovider "${files[@]}" > "$OUT/pytest_gpu.txt" 2>&1
  local rc=$?
  say "pytest -m gpu rc=$rc: $(tail -1 "$OUT/pytest_gpu.txt")"
  return $rc
}
table_from() {  # RUNS.jsonl PREFIX: transfer_paths.py's summary into the engine's table (on the device) and $OUT
  $PY experiments/transfer_paths/transfer_paths.py --summarize "$1" "$2" --table-out oasis_exec/transfer/table.json 2>&1 | tail -2
  cp oasis_exec/transfer/table.json "$OUT/transfer_table.json"
}
install_wheels() {
  local w=() f
  for f in "$CARRIED"/*/*.whl ${WHL:+"$WHL"/*.whl}; do [ -f "$f" ] && w+=("$f"); done
  [ ${#w[@]} -eq 0 ] && return 0
  local todo=()
  for f in "${w[@]}"; do [ -f "$SITE/.installed_$(basename "$f")" ] || todo+=("$f"); done
  [ ${#todo[@]} -eq 0 ] && return 0
  mkdir -p "$SITE"
  if timeout 60 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "${todo[@]}" >> "$OUT/pip.log" 2>&1; then
    for f in "${todo[@]}"; do touch "$SITE/.installed_$(basename "$f")"; done
    say "installed ${#todo[@]} wheel(s) into $SITE"
  else
    say "pip install of ${todo[*]} failed (see $OUT/pip.log)"
  fi
}
device_info() {
  {
    echo "step $STEP $*"
    echo "commit $OASIS_COMMIT"
    echo "date $(date -u '+%Y-%m-%d %H:%M UTC')"
    if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    else echo "no nvidia-smi (no GPU)"; fi
    grep -E 'MemTotal|MemAvailable' /proc/meminfo 2>&1
    echo "cpus $(nproc) $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')"
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1
  } > "$OUT/device.txt"
  cat "$OUT/device.txt"
}

install_wheels
device_info "$@"
case "$STEP" in
  info) exit 0 ;;
  stash)
    mkdir -p "$MODEL_DIR"; n=0
    for f in "$CARRIED"/*/p_?? "$CARRIED"/*/part_??; do [ -f "$f" ] && cp "$f" "$MODEL_DIR/" && n=$((n + 1)); done
    mkdir -p "$VLLM_DIR"; v=0  # pieces of the vLLM bundle (.vb/N/v_??: dense_vs_lookahead_throughput/vllm_setup.sh)
    for f in .vb/*/v_??; do [ -f "$f" ] && cp "$f" "$VLLM_DIR/" && v=$((v + 1)); done
    say "stashed $n model piece(s) in $MODEL_DIR, $v vLLM piece(s) in $VLLM_DIR"; exit 0 ;;
  model) need_model || exit 1; echo "$M"; exit 0 ;;
esac
say "step $STEP"
# shellcheck source=/dev/null
. "$STEP_FILE"
