"""The issue-17 table from one device call's files: vLLM dense (vllm_*.json) against OasisKV (every *.jsonl bench
record under the folder), each ratio against the best vLLM decode throughput at the same context and KV dtype of the
same call, and each sparse run's TPOT against its no-transfer twin (same mode, context, concurrency, host dtype,
decode chain, side-stream priority, selection work, GPU slots a row and ``--repeat`` pass: ``point``). TPOT is a token's (a decode
chain's step over its length); MB/step is a decode pass's; "copy" is the UVA gather's programs x items an iteration. Selection "synthetic, ahead +
top-K": the sets drawn before the timed steps and the model selection's top-K run in each step
(``ExecConfig.synthetic_ahead``, ``synthetic_topk``).

    python experiments/dense_vs_lookahead_throughput/baselines_table.py RESULTS_DIR > baselines.md
"""

import glob
import json
import os
import sys


def load(folder: str) -> tuple:
    vllm, ours = [], []
    for f in sorted(glob.glob(os.path.join(folder, "vllm_*.json"))):
        with open(f) as fh:
            r = json.load(fh)
        for run in r.get("runs", []):
            vllm.append(dict(run, ctx=r["ctx"], kv=r.get("kv_cache_dtype", "auto"), weights=r.get("weights", "dummy")))
    for f in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        with open(f) as fh:
            for line in fh:
                r = json.loads(line) if line.strip() else {}
                if r.get("throughput_tok_s") and r.get("status", "ok") == "ok":
                    ours.append(r)
    return vllm, ours


def weights(r: dict) -> str:
    return "dummy" if r.get("dummy_weights", True) else "real"


def selection(r: dict) -> str:
    """The selection source, with how a synthetic one's work was placed."""
    sel = str(r.get("selection"))
    topk = "top-K" + (f" ({r['topk_kernel']})" if r.get("topk_kernel") else "")  # unrecorded before dd08326
    how = [w for w, on in (("ahead", r.get("synthetic_ahead")), (topk, r.get("synthetic_topk"))) if on]
    return f"{sel}, {' + '.join(how)}" if how else sel


def copy(r: dict) -> str:
    """The copy's launch: UVA programs x items an iteration (``-`` without transfers)."""
    if r.get("no_transfer") or not r.get("uva_programs"):
        return "-"
    return f"{r['uva_programs']}x{r.get('uva_items_per_iter') or 2}"


def point(r: dict) -> tuple:
    """What a run and its no-transfer twin share."""
    return (r["mode"], r["context"], r["concurrency"], r.get("host_kv_dtype", "auto"), weights(r),
            r.get("decode_chain", 1), r.get("stream_priority"), selection(r), r.get("hot_slots"),
            r.get("fetch_ratio"), r.get("fetch_policy"), r.get("plan_marks"), r.get("repeat", 1))  # fmt: skip


def main(folder: str) -> None:
    vllm, ours = load(folder)
    best = {}
    for v in vllm:
        key = (v["ctx"], v["kv"], v["weights"])
        best[key] = max(best.get(key, 0.0), v["decode_tok_s"])
    print(
        "| system | weights | selection | context | requests | KV / host copy | copy | tok/s | TPOT ms | MB/step "
        "| x vLLM bf16 | x vLLM fp8 | TPOT / no-transfer |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in vllm:
        print(f"| vLLM dense | {v['weights']} | - | {v['ctx']} | {v['conc']} | {v['kv']} | - | {v['decode_tok_s']:.1f} "
              f"| {v['tpot_ms']:.2f} | 0 | | | |")  # fmt: skip
    twins = {point(r): r for r in ours if r.get("no_transfer")}
    for r in ours:
        ctx, w = r["context"], weights(r)
        # the real model's contexts (8,096) run vLLM at the same tokens; vLLM's context key is its prompt length
        b16, b8 = best.get((ctx, "auto", w)), best.get((ctx, "fp8", w))
        tps = r["throughput_tok_s"]
        chain = r.get("decode_chain", 1)
        prio = r.get("stream_priority")
        twin = twins.get(point(r))
        over = f"{r['tpot_ms_p50'] / twin['tpot_ms_p50']:.3f}" if twin and not r.get("no_transfer") else ""
        name = r["mode"] + (" (no transfer)" if r.get("no_transfer") else "")
        spec = r.get("speculative_k")
        if spec:
            name += f", speculative k={spec}"
        if chain > 1:
            name += f", decode chain {chain}"
        if prio not in (None, "normal"):
            name += f", streams {prio}"
        if r.get("hot_slots") and r["mode"] != "hisparse":
            name += f", victim cache S={r['hot_slots']}"
        if r.get("fetch_ratio") not in (None, 0.05) and not r.get("no_transfer"):
            name += f", fetch {r['fetch_ratio']:g}"
        print(
            f"| OasisKV {name} | {w} | {selection(r)} | {ctx} | {r['concurrency']} "
            f"| bf16 / {r.get('host_kv_dtype') or 'auto'} | {copy(r)} | {tps:.1f} | {r['tpot_ms_p50']:.2f} | {r.get('bytes_moved_per_step', 0) / 1e6:.1f} "
            f"| {f'{tps / b16:.2f}' if b16 else ''} | {f'{tps / b8:.2f}' if b8 else ''} | {over} |"
        )
    commits = sorted({str(r.get("commit")) for r in ours} | {str(v.get("commit")) for v in vllm if "commit" in v})
    devices = sorted({str(r.get("device")) for r in ours})
    print(f"\nOasisKV commit(s) {', '.join(commits)}; device {', '.join(devices)}; ratios within this folder's call.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
