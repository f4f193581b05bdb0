# Issue 34, "behaviour unchanged": the executor before the restructure (its packages and this experiment's scripts at
# BEFORE_COMMIT, carried as .before/before.tgz) and after it (this tree), run alternately in one call at the points
# of figures_victim_vllm_4e13b06: S = 3K (hot_slots=384) at 16K x 48 and 16K x 44, and 32K x 22; synthetic smollm2
# selection with a model-selected step's work, decode chain 8, fused top-K, CUDA graphs, dummy Qwen3-8B, 52 GB.
# Order: before, after, before, after (one run a point each time), so drift over the call shows as a gap between a
# tree's two passes. Prediction: every after-TPOT within 3% of its before-twin.
# Make the carried tarball first, on the development machine (git is not on the device's copy):
#   mkdir -p .before && git archive --format=tar.gz -o .before/before.tgz 8a45f1a \
#     oasis_core oasis_exec oasis_kernels oasis_sim experiments/dense_vs_lookahead_throughput experiments/common pyproject.toml
#   OASIS_COMMIT=<sha> bash experiments/device.sh dense_vs_lookahead_throughput/restructure_twins   (carry .before)
DEADLINE_S=${DEADLINE_S:-585}
BEFORE_COMMIT=${BEFORE_COMMIT:-8a45f1a}
TGZ=${TGZ:-.before/before.tgz}
SYN=${SYN:-'{"preset": "smollm2"}'}
if [ ! -f "$TGZ" ]; then say "no $TGZ: carry .before (see this step's header)"; exit 2; fi
rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf "$TGZ" -C /tmp/before
HERE=$PWD
run_tree() {  # TREE LABEL BUDGET_S: one pass at the three points, in TREE (its packages first on the path)
  local tree=$1 label=$2 b=$3
  say "$label ($tree, budget ${b}s)"
  (cd "$tree" && PYTHONPATH="$SITE:$tree" OASIS_COMMIT=$([ "$tree" = "$HERE" ] && echo "$OASIS_COMMIT" || echo "$BEFORE_COMMIT") \
    timeout -k 10 $(( b + 5 )) $PY -X faulthandler experiments/dense_vs_lookahead_throughput/h200_headline.py \
    --out "$OUT/$label.jsonl" --contexts 16k,32k --dense-n none --la-n '16k=48,44;32k=22' --max-n none --nt-n none \
    --sens-n none --anchors none --synthetic-work model --exec decode_chain=8 --exec topk_kernel=fused \
    --exec hot_slots=384 --budget-s "$b" --steps 24 --warmup 4 --synthetic "$SYN" 2>&1 | grep -v " plan " \
    | tee "$OUT/$label.log" | grep -E "done|skip|FAIL|fail|rror")
}
PASSES=${PASSES:-4}  # 2: before1, after1 only (a shorter call)
PASS=$(( ($(left) - 30) / PASSES ))
run_tree /tmp/before before1 "$PASS"
if [ "$PASSES" -gt 2 ]; then
  run_tree "$HERE" after1 "$PASS"
  run_tree /tmp/before before2 "$PASS"
fi
run_tree "$HERE" "after$(( PASSES / 2 ))" "$(( $(left) - 20 ))"
$PY - "$OUT" <<'PY' | tee "$OUT/twins.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def runs(name):
    f = out / f"{name}.jsonl"
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.exists() else []
    return {r["label"]: r for r in rows if r.get("status") == "ok"}
passes = {n: runs(n) for n in ("before1", "after1", "before2", "after2")}
labels = sorted(set().union(*[set(p) for p in passes.values()]))
print("| point | before1 TPOT ms | after1 | before2 | after2 | after / before (mean of passes) |")
print("| --- | --- | --- | --- | --- | --- |")
for lab in labels:
    t = {n: passes[n].get(lab, {}).get("tpot_ms_p50") for n in passes}
    b = [v for k, v in t.items() if k.startswith("before") and v]
    a = [v for k, v in t.items() if k.startswith("after") and v]
    ratio = f"{(sum(a) / len(a)) / (sum(b) / len(b)):.3f}" if a and b else "-"
    cells = " | ".join(f"{t[n]:.2f}" if t[n] else "-" for n in ("before1", "after1", "before2", "after2"))
    print(f"| {lab} | {cells} | {ratio} |")
PY
say "done"
pack_out twins.md progress.log before1.jsonl after1.jsonl before2.jsonl after2.jsonl
