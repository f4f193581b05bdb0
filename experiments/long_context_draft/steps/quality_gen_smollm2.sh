# Issue 37, the quality harness in generation on SmolLM2 (8K): the target continues real prompts by itself (GEN:
# greedy or sample at T = 0.7) and at each of the P = 128 steps every draft's query through the resident set is
# compared with the next step's true top-K; K = 64, 128, 256 blocks; contexts 4K, 8K (2K holds 128 blocks, where K =
# 128 and 256 clamp to one and the harness refuses: N_TOKENS=2048 K_BLOCKS='32 64' for it); drafts: the new attention
# head (HEAD_ATTN, default the committed one), n-gram where its match is 2+ tokens else the new head (ngram_attn),
# today's single-key head, n-gram, oracle (the token produced), random (DRAFTS: another list).
#   OASIS_COMMIT=<sha> [GEN=greedy|sample] [HEAD_ATTN=dir] [N_TOKENS='...'] [POSITIONS=P] [K_BLOCKS='...'] bash experiments/device.sh long_context_draft/quality_gen_smollm2
# Also: the resident-set replay (policy unlimited, S = K, 2K, 3K slots) and the SyntheticParams fit of the new head's
# statistics, then synthetic_vs_real.py. -> $OUT/selection_gen_<GEN>.json/.txt, synthetic_vs_real_<GEN>.json/.txt.
need_model || exit 1
D=experiments/long_context_draft
G=${GEN:-greedy}
HA=${HEAD_ATTN:-$D/heads/smollm2-attn-8k}
[ -d "$HA" ] || { say "no attention head at $HA (run train_smollm2 first and commit its head there, or set HEAD_ATTN)"; exit 1; }
timeout -k 10 "${QUALITY_S:-540}" $PY -m oasis_exec quality selection --model-path "$M" --texts GPL-3 argparse.py \
  --token-texts $D/data/smollm2_8k.npz:text:licences $D/data/smollm2_8k.npz:held:0 $D/data/smollm2_8k.npz:held:1 \
  --n-tokens ${N_TOKENS:-4096 8192} --positions ${POSITIONS:-128} --k-blocks ${K_BLOCKS:-64 128 256} --generate "$G" --temperature 0.7 \
  --drafts ${DRAFTS:-eagle3_attn ngram_attn eagle3 ngram oracle random} --draft-path experiments/trained_draft_head/smollm2-eagle3 \
  --draft-attn-path "$HA" --policies unlimited --slots-ratio 1 2 3 --policy-draft eagle3_attn \
  --fit-draft eagle3_attn --device cuda --dtype bfloat16 --commit "$OASIS_COMMIT" \
  --out "$OUT/selection_gen_$G.json" 2>&1 | grep -v -E 'Warning|it/s\]' | tee "$OUT/selection_gen_$G.txt"
say "quality rc=${PIPESTATUS[0]}"
# Synthetic selections against these real ones: fetches a row a step at S = K, 2K, 3K (each within 10% of real)
timeout -k 5 120 $PY $D/synthetic_vs_real.py "$OUT/selection_gen_$G.json" --preset smollm2 paper fit:eagle3_attn \
  --out "$OUT/synthetic_vs_real_$G.json" 2>&1 | tee "$OUT/synthetic_vs_real_$G.txt"
say "synthetic_vs_real rc=${PIPESTATUS[0]} (1: some preset outside 10%)"
