# Issue 40: what beside's speculative step runs that the simulator does not price (its k = 1 tok/s is +7-9% in the
# simulator's replay of the db51c33 recording): kernel profiles of the k = 1 step at the Qwen3-8B shape (dummy weights,
# synthetic selection of the smollm2 preset, acceptance drawn from the real head's k = 1 histogram {"1": [145, 111]},
# 16K x 44, 52 GB, UVA), spec_predict after and beside under CUDA graphs (the kernels each adds, the GPU-busy union
# and span against the host wall), and beside eager (the per-stream split: the prediction stream's launches).
#   OASIS_COMMIT=<hash> [K0=1] [WARMUP=40] bash experiments/device.sh decode_step_profile/spec_beside
#     -> spec_beside.jsonl, profile_*.txt (6ec514d's call: 6 warm-up steps, no k = 0 run; results/spec_beside_h100_6ec514d/)
DEADLINE_S=${DEADLINE_S:-400}
ACC=${SPEC_ACCEPT:-'{"1": [145, 111]}'}
P=($PY experiments/decode_step_profile/step_profile.py --mode lookahead --context 16384 --concurrency 44
  --kv-budget-gb 52 --no-host-fill --synthetic '{"preset": "smollm2"}' --speculative-k 1 --synthetic-accept "$ACC"
  --warmup "${WARMUP:-6}" --top 60 --out "$OUT/spec_beside.jsonl")
RUN_S=${RUN_S:-130}
[ "${K0:-0}" = 1 ] && profile_run k0 --speculative-k 0  # the ordinary step beside them (K0=1; e.g. with WARMUP=40, the steady state)
profile_run k1_after --exec spec_predict=after
profile_run k1_beside --exec spec_predict=beside
profile_run k1_beside_eager --exec spec_predict=beside --no-cuda-graph
say "done"
