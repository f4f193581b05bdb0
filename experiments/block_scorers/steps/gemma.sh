# Issue 38: the block scorers on Gemma 3 270M's full layers (5, 11, 17) at 16K and 32K, H200, fp32, transformers
# (5.17 on the GPU machine loads the weights; its GGUF tokenizer is wrong, so the token ids come from
# experiments/block_scorers/gemma_licences_ids.json, made here with 5.25: `gemma_hf.py --save-ids`).
# Gemma's GGUF arrives in 8 pieces of 32 MB over calls back to back (/work/shared/models/README.md:
# `split -b 32M gemma-3-270m-q4_k_m.gguf .models/g/p_`, one piece a folder, `stash` in every call but the last, the
# gguf wheel with the last), then:
#   MODEL_DIR=/tmp/g MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
#     OASIS_COMMIT=<sha> bash experiments/device.sh block_scorers/gemma      -> gemma_16384.json, gemma_32768.json, *.log
# Per scorer and K in {64, 128, 256}: mass (next query's true attention + local block), best-K mass, recall of the
# true top-K, proxy, and the correct draft's lookahead agreement through the scorer's own resident set.
DEADLINE_S=${DEADLINE_S:-540}
need_model || exit 1
ALL=${SCORERS:-"minmax minmax_sum mean gauss minmax+sink minmax_sum+sink mean+sink gauss+sink"}
for n in 16384 32768; do
  T=$(min 300 $(( $(left) - 10 ))); [ "$T" -lt 60 ] && { say "no time for $n"; continue; }
  say "gemma $n"
  # shellcheck disable=SC2086
  timeout -k 5 "$T" $PY experiments/block_scorers/gemma_hf.py --model "$M" --device cuda --n-tokens $n \
    --positions 32 --ks 64 128 256 --scorers $ALL --ids experiments/block_scorers/gemma_licences_ids.json \
    --out "$OUT/gemma_$n.json" 2>&1 | tr '\r' '\n' | grep -v -i -e warn -e "it/s" > "$OUT/gemma_$n.log"
  say "gemma $n rc=${PIPESTATUS[0]} $(tail -3 "$OUT/gemma_$n.log" | tr '\n' ' ')"
done
say "done"
