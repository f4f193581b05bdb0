# Source me on the GPU machine (from the repository root, inside a step of experiments/device.sh): vLLM 0.26, the dense
# baseline, assembled from the pieces of its bundle and put on PYTHONPATH for this shell only (never CI, never here).
#
# The bundle (../../../shared/vllm/README.md) is vLLM's trimmed wheel as one xz tar (~72 MB) plus ~18 MB of wheels it
# needs beyond the GPU image. A call carries 64 MiB with the ~22 MB working tree, so the tar goes in 35 MiB pieces:
#   here, once:  bash /work/shared/vllm/build_bundle.sh "$PWD/.vb"      (absolute path; writes .vb/a, .vb/b)
#                cat .vb/a/part_aa .vb/b/part_ab > /tmp/v.tar.xz && sha256sum /tmp/v.tar.xz | cut -d' ' -f1 > v.sha256
#                split -b 35M /tmp/v.tar.xz v_  ->  .vb/1/v_aa, .vb/2/v_ab;  .vb/3/ = .vb/b/*.whl + v.sha256
#   calls:       carry .vb/1, then .vb/2, each `bash experiments/device.sh stash` (-> $VLLM_DIR); the step's call
#                carries .vb/3 (with .models/b: 42 MB) and sources this file.
# Installs into /tmp/vsite (vLLM) and /tmp/vsite2 (the wheels), once per machine. Sourced by a step of
# experiments/device.sh, whose say and in_name_order it uses.
VLLM_DIR=${VLLM_DIR:-/tmp/vbx}
vllm_ready() {
  if [ ! -d /tmp/vsite/vllm ]; then
    local parts; parts=$(in_name_order "$VLLM_DIR"/v_?? .vb/*/v_??)  # experiments/device.sh's
    [ -z "$parts" ] && { echo "vllm_setup: no pieces v_?? in $VLLM_DIR or .vb/*/ (stash them first)"; return 1; }
    # shellcheck disable=SC2086
    cat $parts > /tmp/v.tar.xz || return 1
    if [ -f .vb/3/v.sha256 ] && [ "$(sha256sum /tmp/v.tar.xz | cut -d' ' -f1)" != "$(cat .vb/3/v.sha256)" ]; then
      echo "vllm_setup: the assembled bundle's sha256 is not .vb/3/v.sha256 (a piece missing?)"; return 1
    fi
    mkdir -p /tmp/vsite && python3 -c "import tarfile; tarfile.open('/tmp/v.tar.xz').extractall('/tmp/vsite')" || return 1
    rm -f /tmp/v.tar.xz
  fi
  if [ ! -f /tmp/vsite2/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite2 .vb/3/*.whl \
      && touch /tmp/vsite2/.done || return 1
  fi
  # spawn: with --gguf the parent initialises CUDA before LLM(); a forked engine core then cannot ("Cannot
  # re-initialize CUDA in forked subprocess", results/baselines_more_8e1c817/vllm_real_8096.log)
  export PYTHONPATH=/tmp/vsite:/tmp/vsite2${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 \
    VLLM_LOGGING_LEVEL=WARNING VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
}
vllm_unpack() {  # vllm_ready without the PYTHONPATH, for a step to run in the background (CPU only) during its tests
  ( vllm_ready > "$OUT/vllm_ready.log" 2>&1 ) || say "vLLM bundle not ready: $(tail -1 "$OUT/vllm_ready.log")"
}
vllm_run() {  # NAME TIMEOUT ARGS...: one vllm_dense.py run in its own shell (vLLM's PYTHONPATH only there)
  local name=$1 t=$2; shift 2
  say "vLLM $name: $*"
  ( vllm_ready && timeout -k 5 "$t" python3 experiments/dense_vs_lookahead_throughput/vllm_dense.py "$@" \
    --out "$OUT/vllm_$name.json" ) > "$OUT/vllm_$name.log" 2>&1 \
    || say "vLLM $name failed: $(grep -v '^\s*$' "$OUT/vllm_$name.log" | tail -2 | cut -c1-300)"
  [ -f "$OUT/vllm_$name.json" ] && say "vLLM $name: $(python3 -c "import json,sys; print([(r['conc'], r['decode_tok_s'], r['tpot_ms']) for r in json.load(open(sys.argv[1]))['runs']])" "$OUT/vllm_$name.json")"
}
