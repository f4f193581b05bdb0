# Issue 40's Gemma row: speculation with lookahead on Gemma 3 270M (real weights, the model's own selection and
# acceptance) at 32K, with its attention draft head (heads/gemma-attn-32k: speculates at k = 1 only), in the last of
# the calls that bring Gemma's pieces (.models/a..d stashed into MODEL_DIR, .models/e and the head's
# model.safetensors carried with this one):
#   MODEL_DIR=/tmp/mg OASIS_COMMIT=<sha> bash experiments/device.sh speculative_decoding/gemma_spec
# 1. pytest -m gpu: the attention head at k = 1 in the speculative step's CUDA graph equals eager (after, beside); prompt
#    lookup in graphed chains equals eager; the head's K/V read by the ring kernel equals its reference
# 2. spec_rows.sh: spec_study.py on the licences' 32K token ids (data/gemma_32k.npz:text:licences; no tokenizer on the device),
#    (SPEC_CHAIN, 8: also k = 1 with its speculative steps chained 8 at a time, ExecConfig.spec_chain; 1: not)
#    CONTEXT (32000) tokens a request, K = TOP_K (256) blocks, the same GPU KV budget for every run (KV_GB, 3 GB),
#    minmax_sum+sink for every run (block_score=auto would give tokens to after and minmax_sum+sink to beside):
#    lookahead k = 0, 1 after (one prefill) and k = 0 with decode chains of CHAINED (8) steps on an engine of its own
#    (the table's baseline: the ordinary engine's best step), lookahead k = 1 beside, dense k = 0, 1 (N_DENSE 64,
#    clipped to the lanes 3 GB holds)                                             -> $OUT/gemma.jsonl, gemma.md
# (6ec514d's call ran without the chained k = 0: results/h100_6ec514d/). SKIP_TESTS=1, SKIP_LOOK=1 (dense only).
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M
DEADLINE_S=${DEADLINE_S:-560}
# the first group runs three engines, each with a 32K prefill of 60-100 s on the H100 (c088cc2): 150 s a group cut
# it after its first engine; the whole step took 360 s with 415
RUN_S=${RUN_S:-400}
need_model || exit 1
D=experiments/long_context_draft
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  say "pytest -m gpu (attention head, k = 1)"
  TEST_S=${TEST_S:-120} gpu_tests tests/gpu/test_spec_pipeline_gpu.py tests/gpu/test_exec_gpu.py \
    tests/gpu/test_ring_attn_gpu.py::test_draft_head_kv_attend_equals_its_reference -k "attn or ngram or draft"
fi
HEAD=$D/heads/gemma-attn-32k TEXT=$D/data/gemma_32k.npz:text:licences NAME=gemma
CONTEXT=${CONTEXT:-32000} TOP_K=${TOP_K:-256} N_DENSE=${N_DENSE:-64} SPEC_CHAIN=${SPEC_CHAIN:-8}
. experiments/speculative_decoding/spec_rows.sh
