# Call 2 of the vLLM baseline (issue 17), right after vllm_stash: vLLM 0.26 dense and OasisKV in ONE call on one H200,
# so the ratio is measured under one machine state (two vLLM runs of one day differ by ~3%). Qwen3-8B shape, dummy
# weights, 52 GB KV budget: vLLM dense at 16K (21 and 16 requests) and 32K (10); OasisKV dense at its maximum and
# lookahead at 16K (32, 44) and 32K (16, 22) with no-transfer twins, synthetic selection (SyntheticParams defaults
# unless SYN is given, e.g. SYN='{"preset": "smollm2"}'). Carry .vb/b holding the bundle's second part and its wheels
# plus copies of /work/shared/vllm/setup.sh and dense_bench.py (cp them into .vb/b/).
#   OASIS_COMMIT=<hash> bash experiments/device.sh dense_vs_lookahead_throughput/vllm_same_call   -> vllm_*.json, oasis.jsonl
# Estimate: vLLM ~90 s engine start per context + ~60 s of runs; OasisKV ~150 s (one 106 GB pool pinned once).
DEADLINE_S=${DEADLINE_S:-580}
for f in setup.sh dense_bench.py part_ab; do [ -f .vb/b/$f ] || { say "no .vb/b/$f (see the comment above)"; exit 1; }; done
for spec in "16384 21,16" "32768 10"; do
  set -- $spec
  say "vLLM dense ctx=$1 conc=$2"
  ( source .vb/b/setup.sh \
    && timeout -k 5 200 python3 .vb/b/dense_bench.py --ctx "$1" --conc "$2" --kv-bytes 52e9 --out "$OUT/vllm_$1.json" ) \
    > "$OUT/vllm_$1.log" 2>&1 || say "vLLM ctx=$1 failed: $(tail -2 "$OUT/vllm_$1.log")"
done
B=$(( $(left) - 15 ))
say "OasisKV (budget ${B}s)"
timeout -k 10 $(( B + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
  --out "$OUT/oasis.jsonl" --contexts 16k,32k --dense-n 'max' --la-n '16k=32,44;32k=16,22' --max-n none \
  --nt-n '16k=32,44;32k=16' --sens-n none --anchors none --variants none --budget-s "$B" \
  ${SYN:+--synthetic "$SYN"} 2>&1 | grep -v " plan " | tee "$OUT/oasis.log"
$PY - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
best = {}
for f in glob.glob(os.path.join(out, "vllm_*.json")):
    r = json.load(open(f))
    for run in r.get("runs", []):
        tps = run.get("decode_tok_s") or run.get("throughput_tok_s")
        if tps:
            best[r["ctx"]] = max(best.get(r["ctx"], 0), tps)
print("vLLM best decode tok/s:", best)
for line in open(os.path.join(out, "oasis.jsonl")):
    r = json.loads(line)
    if r.get("status") == "ok" and r["context"] in best:
        print(f"{r['label']:<32} {r['throughput_tok_s']:8.1f} tok/s  {r['throughput_tok_s'] / best[r['context']]:.2f}x vLLM")
PY
say "done"
