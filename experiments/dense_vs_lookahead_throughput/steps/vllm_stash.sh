# Call 1 of the vLLM baseline (issue 17; ../../../shared/vllm/README.md): keep the first piece of the vLLM bundle,
# carried as .vb/a (`bash /work/shared/vllm/build_bundle.sh "$PWD/.vb"` from the checkout, once per machine: the path
# must be absolute, the script changes directory before it writes), for the next call.
#   bash experiments/device.sh dense_vs_lookahead_throughput/vllm_stash           (carry .vb/a)
DEADLINE_S=${DEADLINE_S:-60}
[ -f .vb/a/part_aa ] || { say "no .vb/a/part_aa: build the bundle and carry .vb/a"; exit 1; }
mkdir -p /tmp/vbx && cp .vb/a/part_aa /tmp/vbx/ && say "stashed $(du -m /tmp/vbx/part_aa | cut -f1) MB in /tmp/vbx"
