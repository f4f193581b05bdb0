# Issue 17: why the fp8 (e4m3) host copy bought nothing at 16K x 44 (2,279 tok/s against bf16's 2,294 at 8e1c817,
# half the bytes a step): the kernel profile of that step, beside lookahead_44's bf16 one (055bdf9).
#   OASIS_COMMIT=<hash> bash experiments/device.sh decode_step_profile/fp8_44   -> fp8_44.jsonl, profile_fp8_44.txt
DEADLINE_S=${DEADLINE_S:-165}
SYN=${SYN:-'{"preset": "smollm2"}'}
say "profile fp8 16K x 44"
timeout -k 5 $(( $(left) - 5 )) $PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill \
  --synthetic "$SYN" --top 40 --mode lookahead --context 16384 --concurrency 44 --host-kv-dtype fp8_e4m3 \
  --out "$OUT/fp8_44.jsonl" > "$OUT/profile_fp8_44.txt" 2>&1 || say "failed: $(tail -2 "$OUT/profile_fp8_44.txt")"
say "done"
