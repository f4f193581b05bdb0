# Issue 40's SmolLM2 row with the long-context attention head (heads/smollm2-attn-8k, trained on 384 windows of
# 8,192 tokens; speculates at k = 1 only): real weights, the model's own selection and acceptance, CONTEXT (7800)
# tokens of traces/texts/argparse.py.txt, K = TOP_K (64) blocks, the same GPU KV budget for every run (KV_GB, 3 GB),
# after the model's pieces are stashed (MODEL_DIR) or carried:
#   MODEL_DIR=/tmp/ms OASIS_COMMIT=<sha> bash experiments/device.sh speculative_decoding/smol_attn_spec
# 1. pytest -m gpu: the head's K/V read by the ring kernel = its reference (SmolLM2's and Gemma's head shapes), the
#    attention head at k = 1 in the speculative step's CUDA graph = eager              -> $OUT/pytest_gpu.txt
# 2. spec_rows.sh: lookahead k = 0, 1 after and k = 0 with decode chains of CHAINED (8) steps on an engine of its own
#    (SPEC_CHAIN, 6: also k = 1 with its speculative steps chained 6 at a time, ExecConfig.spec_chain; 1: not;
#    6, not 8: 7,800 tokens + 23 steps x 12 tokens of decode room fit 8,192 positions, x 16 would not)
#    (the table's baseline), lookahead k = 1 beside, dense k = 0, 1 (N_DENSE 16)   -> $OUT/smol_attn.jsonl, .md
# (the single-key head's table at the same settings: pipelined.sh). SKIP_TESTS=1, SKIP_LOOK=1 (dense only);
# HEAD another head directory. STEPS past 16 need a shorter CONTEXT (7,800 + the decode room within 8,192).
DEADLINE_S=${DEADLINE_S:-560}
need_model || exit 1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  say "pytest -m gpu (the draft head's ring read, attention head at k = 1, chained speculative steps)"
  TEST_S=${TEST_S:-150} gpu_tests tests/gpu/test_ring_attn_gpu.py::test_draft_head_kv_attend_equals_its_reference \
    tests/gpu/test_spec_pipeline_gpu.py tests/gpu/test_spec_chain_gpu.py -k "draft or attn or chained"
fi
HEAD=${HEAD:-experiments/long_context_draft/heads/smollm2-attn-8k} TEXT= NAME=smol_attn
CONTEXT=${CONTEXT:-7800} TOP_K=${TOP_K:-64} N_DENSE=${N_DENSE:-16} SPEC_CHAIN=${SPEC_CHAIN:-6}
. experiments/speculative_decoding/spec_rows.sh
