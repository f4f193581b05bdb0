# Issue 17's overlap: where the 16K x 44 lookahead step spends its time against its no-transfer twin, and 32K x 22
# (kernel profiles, dummy Qwen3-8B, synthetic selection of the smollm2 preset, top-K 128, fetch 0.05, 52 GB, UVA).
#   OASIS_COMMIT=<hash> bash experiments/device.sh decode_step_profile/lookahead_44   -> lookahead_44.jsonl, *.txt
DEADLINE_S=${DEADLINE_S:-540}
SYN=${SYN:-'{"preset": "smollm2"}'}
P=($PY experiments/decode_step_profile/step_profile.py --kv-budget-gb 52 --no-host-fill --synthetic "$SYN" --top 40
  --out "$OUT/lookahead_44.jsonl")
profile_run la16k44 --mode lookahead --context 16384 --concurrency 44
profile_run nt16k44 --mode lookahead --context 16384 --concurrency 44 --no-transfer
profile_run la32k22 --mode lookahead --context 32768 --concurrency 22
profile_run nt32k22 --mode lookahead --context 32768 --concurrency 22 --no-transfer
say "done"
