# Issue 37, the quality harness in generation on Gemma 3 270M (needs the Gemma decoder of issue 36 in
# oasis_exec.model.decoder.Decoder.from_path): contexts 4K, 16K, 32K of the Debian licences joined and a held-out window
# (token ids made here: data/gemma_32k.npz; no tokenizer runs on the device), P = 64 generated steps, K = 64, 128,
# 256 blocks, the three full-attention layers reported (5, 11, 17), drafts (DRAFTS): the new attention head
# (HEAD_ATTN), n-gram where its match is 2+ tokens else the head (ngram_attn), n-gram, oracle (the token produced),
# random (no single-key head exists for Gemma).
#   MODEL_DIR=/tmp/mg \
#     OASIS_COMMIT=<sha> [GEN=greedy|sample] [HEAD_ATTN=dir] [N_TOKENS='...'] [POSITIONS=P] [K_BLOCKS='...'] bash experiments/device.sh long_context_draft/quality_gen_gemma
# TEXTS (token texts, default the licences and held-out window 0: e.g. '...npz:held:1'), SKIP_SYNTH=1 (no synthetic
# against real comparison after), DRAFTS (the list above).
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # Gemma 3 270M Q4_K_M (device.sh defaults to SmolLM2)
need_model || exit 1
D=experiments/long_context_draft
G=${GEN:-greedy}
HA=${HEAD_ATTN:-$D/heads/gemma-attn-32k}
[ -d "$HA" ] || { say "no attention head at $HA (run train_gemma first and commit its head there, or set HEAD_ATTN)"; exit 1; }
timeout -k 10 "${QUALITY_S:-540}" $PY -m oasis_exec quality selection --model-path "$M" --texts \
  --token-texts ${TEXTS:-$D/data/gemma_32k.npz:text:licences $D/data/gemma_32k.npz:held:0} \
  --n-tokens ${N_TOKENS:-4096 16384 32768} --positions ${POSITIONS:-64} --k-blocks ${K_BLOCKS:-64 128 256} --generate "$G" --temperature 0.7 \
  --report-layers 5 11 17 --drafts ${DRAFTS:-eagle3_attn ngram_attn ngram oracle random} --draft-attn-path "$HA" --device cuda \
  --policies unlimited --slots-ratio 1 2 3 --policy-draft eagle3_attn --fit-draft eagle3_attn \
  --dtype bfloat16 --commit "$OASIS_COMMIT" --out "$OUT/selection_gen_$G.json" 2>&1 \
  | grep -v -E 'Warning|it/s\]' | tee "$OUT/selection_gen_$G.txt"
say "quality rc=${PIPESTATUS[0]}"
[ "${SKIP_SYNTH:-0}" = 1 ] && return 0
# Synthetic selections against these real ones: fetches a row a step at S = K, 2K, 3K (each within 10% of real)
timeout -k 5 120 $PY $D/synthetic_vs_real.py "$OUT/selection_gen_$G.json" --preset smollm2 gemma3 paper fit:eagle3_attn \
  --out "$OUT/synthetic_vs_real_$G.json" 2>&1 | tee "$OUT/synthetic_vs_real_$G.txt"
say "synthetic_vs_real rc=${PIPESTATUS[0]} (1: some preset outside 10%)"
