# Issue 38: every scorer and the per-token scorer (oasis_core.token_scorer, bases calib/gemma3_270m_basis.npz) on
# Gemma 3 270M's full layers at 32K, H200, fp32, the repo's decoder (gemma_chunked.py: no transformers, so no
# tokenizer issue; the texts are token ids in the repo). Gemma's GGUF arrives in 8 pieces as for steps/gemma.sh, then:
#   MODEL_DIR=/tmp/g MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
#     OASIS_COMMIT=<sha> bash experiments/device.sh block_scorers/gemma_tokens     -> gemma32k_<text>.json, *.log
# Texts: the licences (the CPU run's) and the 4 held-out windows of ../long_context_draft/data/gemma_32k.npz (the
# bases were fitted on train:0, never on these); 32 positions; K = 64 / 128 / 256 (the goal: mass >= 80% at K = 256),
# with the correct draft's lookahead agreement through each scorer's own resident set (the CPU run lacks it).
DEADLINE_S=${DEADLINE_S:-540}
need_model || exit 1
export OASIS_GEMMA3_GGUF="$M"
ALL=${SCORERS:-"minmax minmax_sum mean gauss minmax+sink minmax_sum+sink mean+sink gauss+sink"}
for text in licences held:0 held:1 held:2 held:3; do
  T=$(min 150 $(( $(left) - 10 ))); [ "$T" -lt 60 ] && { say "no time for $text"; continue; }
  f=gemma32k_${text/:/}
  say "gemma 32K $text"
  # shellcheck disable=SC2086
  timeout -k 5 "$T" $PY experiments/block_scorers/gemma_chunked.py --device cuda --text "$text" --n-tokens 32768 \
    --positions 32 --ks 64 128 256 --scorers $ALL --token-scorers pairs32 pairs64 --draft-chunk 96 \
    --out "$OUT/$f.json" > "$OUT/$f.log" 2>&1
  say "gemma $text rc=$? $(grep -e 'tokens:pairs64 *K=256' -e 'minmax *K=256' "$OUT/$f.log" | tr '\n' ' ')"
done
say "done"
