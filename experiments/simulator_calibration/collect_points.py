"""Collect the executor's H200 bench runs of this repository into bench points (``oasis_sim.bench``), split into the
set the calibration is fitted on and the set it is scored on, which the fit never sees.

    python experiments/simulator_calibration/collect_points.py   # rewrites traces/bench_points/{train,heldout}/

**Fitted on** (``train/``): the runs of the executor as it stands since plan_marks and the victim cache (commits
4e13b06, f1fc382, 6fa88eb, 2026-12-02: dummy Qwen3-8B at 52 GB, 16K x 16/44/48 and 32K x 22, S = 3K and S = K, with
their no-transfer twins, the fp8 host copy; rows with ``plan_marks`` off are an older engine and left out), the real
SmolLM2-135M runs with CUDA graphs (8c7535e, 2868b70, 3ca3b31, 8e1c817, 2026-12-01: 4K-8K tokens, 16 and 32 lanes, no
budget; the speculative study's ``fresh`` runs at k = 0), OasisKV dense Qwen3-8B at 16K x 21 (DESIGN.md, 2026-12-01)
vLLM 0.26 dense on dummy Qwen3-8B (DESIGN.md 2026-11-29 and 2026-12-01, the calls of dc6e77f and 4e13b06) and on
the real SmolLM2 at 8,096 x 32 (2868b70), and the decode-chain calls of dc6e77f (chain 8 and chain 1 in one call, S = K,
the only runs that tell the host's share of a step from the GPU's), and vLLM's floor probes on SmolLM2 at 1-64
requests (``vllm_floor_points``; of the H100 of 1dc31ae only those at <= FLOOR_KNEE_REQUESTS requests, the rest in
``other_cards/``).

**Held out** (``heldout/``): the points measured on 2026-12-04 at 7e01859 that DESIGN.md gives ("Re-measured on
2026-12-04"): vLLM 16K x 16 and 32K x 10; lookahead with the victim cache 16K x 48 and 32K x 22, and the 32K x 22
no-transfer twin from its stated ratio (1.113); real SmolLM2 at 7,800 tokens and 3 GB of GPU KV: vLLM x 16, dense
x 15, lookahead K = 128 x 50 and K = 64 x 82. Different shapes (SmolLM2 at K = 128, 50 and 82 lanes, a 3 GB budget),
a different day and commit, real weights and the model's own selections. Their bytes a step are not in the
repository (null: not scored).
"""

from __future__ import annotations

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from oasis_sim.bench import BenchPoint, dumps_point  # noqa: E402
from oasis_sim.calibrate import card_admits  # noqa: E402

CARD = "h200"  # the card calibrated (oasis_sim/data/calibration_h200.json)

RESULTS = os.path.join(ROOT, "experiments")
CURRENT_QWEN = {"4e13b06", "f1fc382", "6fa88eb"}
SMOLLM2_COMMITS = ("8c7535e", "2868b70", "3ca3b31", "8e1c817")
SMOLLM2_GGUF = "/tmp/m/model.gguf"


def rows(pattern):
    for f in sorted(glob.glob(os.path.join(RESULTS, pattern), recursive=True)):
        for line in open(f, encoding="utf-8"):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and d.get("throughput_tok_s") and d.get("tpot_ms_mean"):
                yield os.path.relpath(f, ROOT), d


def plain(d) -> bool:
    """A plain timed bench run: CUDA graphs, no profile, no speculative decoding, plan_marks not switched off."""
    return (
        d.get("cuda_graph", True) is not False
        and not d.get("profile")
        and d.get("speculative_k") in (0, None)
        and d.get("plan_marks", True) is not False
        and d.get("run") != "phase"
    )


def point(src, d, model, **kw) -> BenchPoint:
    return BenchPoint(
        model=model,
        mode=d["mode"],
        context=int(d["context"]),
        lanes=int(d["concurrency"]),
        tpot_ms=round(float(d["tpot_ms_mean"]), 4),
        tok_s=round(float(d["throughput_tok_s"]), 2),
        bytes_per_step=float(d.get("bytes_moved_per_step") or 0.0),
        kv_budget_gb=d.get("kv_budget_gb"),
        top_k=int(d.get("top_k") or 128),
        hot_slots=d.get("hot_slots"),
        fetch_ratio=float(d.get("fetch_ratio") or 0.05),
        no_transfer=bool(d.get("no_transfer")),
        transfer_path=d.get("transfer_path") or "uva",
        decode_chain=int(d.get("decode_chain") or 1),
        host_kv_dtype=d.get("host_kv_dtype") or "auto",
        selection=d.get("selection") or "synthetic",
        date=str(d.get("date", ""))[:10],
        commit=str(d.get("commit", ""))[:7],
        source=src,
        **kw,
    )


def train_points() -> dict:
    out = {
        "qwen3_8b_current.jsonl": [],
        "qwen3_8b_chains.jsonl": [],
        "smollm2_real.jsonl": [],
        "vllm_dense.jsonl": [],
        "vllm_dense_smollm2.jsonl": [],
    }
    for src, d in rows("dense_vs_lookahead_throughput/results/**/*.jsonl"):
        if str(d.get("commit", ""))[:7] in CURRENT_QWEN and d["mode"] == "lookahead" and plain(d):
            out["qwen3_8b_current.jsonl"].append(point(src, d, "qwen3-8b", weights="dummy"))
        elif "decode_chain_dc6e77f" in src and d["mode"] == "lookahead" and plain(d):
            d = {**d, "hot_slots": d.get("hot_slots") or d.get("top_k") or 128}  # before the victim cache: S = K
            out["qwen3_8b_chains.jsonl"].append(point(src, d, "qwen3-8b", weights="dummy"))
    seen = set()
    for pattern in (
        "real_model_step_cost/results/*.jsonl",
        "speculative_decoding/results/**/*.jsonl",
        "dense_vs_lookahead_throughput/results/baselines_*/*.jsonl",
    ):
        for src, d in rows(pattern):
            if d.get("model") != SMOLLM2_GGUF or d.get("dummy_weights") is not False or not plain(d):
                continue
            if not str(d.get("commit", "")).startswith(SMOLLM2_COMMITS) or d["mode"] not in ("dense", "lookahead"):
                continue
            key = (
                src,
                d["mode"],
                d["context"],
                d["concurrency"],
                d.get("selection"),
                d.get("no_transfer"),
                round(d["tpot_ms_mean"], 3),
            )
            if key in seen:
                continue
            seen.add(key)
            out["smollm2_real.jsonl"].append(point(src, d, "smollm2-135m", weights="real", synthetic_preset="smollm2"))
    design = "DESIGN.md (../shared/DESIGN.md)"
    ours = [  # OasisKV dense, dummy Qwen3-8B, 52 GB, 2026-12-01
        BenchPoint(
            "qwen3-8b",
            "dense",
            16384,
            21,
            tpot_ms=17.2,
            tok_s=1219.0,
            bytes_per_step=0.0,
            kv_budget_gb=52.0,
            decode_chain=1,
            date="2026-12-01",
            source=design,
            note="OasisKV dense 1,219 tok/s at 21",
        ),
    ]
    out["qwen3_8b_current.jsonl"] += ours
    vllm = [  # (context, lanes, kv_budget_gb or None = whole H200, tok/s, TPOT ms, date, source)
        (16384, 8, None, 810.0, 9.9, "2026-11-29", design),
        (16384, 32, None, 1338.0, 23.9, "2026-11-29", design),
        (16384, 40, None, 1323.0, 30.2, "2026-11-29", design),
        (16384, 16, 52.0, 1104.0, 14.5, "2026-11-29", design),
        (16384, 21, 52.0, 1073.0, 19.6, "2026-11-29", design),
        (32768, 8, None, 553.0, 14.5, "2026-11-29", design),
        (32768, 20, None, 598.0, 33.4, "2026-11-29", design),
        (32768, 10, 52.0, 508.0, 19.7, "2026-11-29", design),
        (16384, 21, 52.0, 1092.0, None, "2026-12-01", design),
        (16384, 16, 52.0, 1122.0, None, "2026-12-01", design),
        (16384, 16, 52.0, 1120.9, 14.27, "2026-12-01", "dense_vs_lookahead_throughput/results/decode_chain_dc6e77f"),
        (16384, 21, 52.0, 1089.8, 19.27, "2026-12-01", "dense_vs_lookahead_throughput/results/decode_chain_dc6e77f"),
        (32768, 10, 52.0, 523.7, 19.09, "2026-12-01", "dense_vs_lookahead_throughput/results/decode_chain_dc6e77f"),
        (
            16384,
            16,
            52.0,
            1098.4,
            14.57,
            "2026-12-02",
            "dense_vs_lookahead_throughput/results/figures_victim_vllm_4e13b06",
        ),
        (
            32768,
            10,
            52.0,
            518.9,
            19.27,
            "2026-12-02",
            "dense_vs_lookahead_throughput/results/figures_victim_vllm_4e13b06",
        ),
    ]
    out["vllm_dense_smollm2.jsonl"].append(
        BenchPoint(
            "smollm2-135m",
            "dense",
            8096,
            32,
            tpot_ms=3.54,
            tok_s=9038.3,
            decode=64,  # steps/baselines_more.sh: --decode 64 (its record: 1,792 tokens in 0.198 s)
            bytes_per_step=0.0,
            engine="vllm",
            weights="real",
            decode_chain=1,
            date="2026-12-01",
            commit="2868b70",
            source="dense_vs_lookahead_throughput/results/baselines_more_8e1c817/README.md",
            note="vLLM 0.26 on the real SmolLM2 weights (GGUF, bf16), the whole H200",
        )
    )
    for ctx, n, gb, tok, tpot, date, src in vllm:
        out["vllm_dense.jsonl"].append(
            BenchPoint(
                "qwen3-8b",
                "dense",
                ctx,
                n,
                tpot_ms=tpot,
                tok_s=tok,
                bytes_per_step=0.0,
                engine="vllm",
                kv_budget_gb=gb if gb else 141 * 0.9 - 16.4,
                decode_chain=1,
                date=date,
                source=src,
                note="vLLM 0.26, FlashAttention-3, CUDA graphs; budget None: the whole H200 (gpu util 0.9)",
            )
        )
    for name, pts in vllm_floor_points().items():  # another card's: only what card_admits (the host's floor)
        out[name] = [p for p in pts if card_admits(p, CARD)]
    return out


def vllm_floor_points() -> dict:
    """vLLM 0.26 dense on the real SmolLM2-135M at 1-64 requests (``steps/vllm_host_floor.sh``: where its host loop,
    not the GPU, sets the step): what separates the step floor's constant from its growth a request
    (``oasis_sim.calibrate.floor_probes``). The card is the one the call got (``device.txt``): probes of the calibrated
    card are all training points; of another card (the H100 of 1dc31ae) only those at <= ``FLOOR_KNEE_REQUESTS``
    requests (``card_admits``: the host loop, CPU-side, the same Xeon type on both machines; the calibration scores
    them against the floor alone) are, the rest go to ``other_cards/`` (past the knee attention's HBM bandwidth,
    3.35 against 4.8 TB/s, sets the step: validated, never fitted)."""
    out = {}
    for f in sorted(glob.glob(os.path.join(HERE, "results", "vllm_floor_*", "vllm_floor_*.json"))):
        d = json.load(open(f, encoding="utf-8"))
        dev = open(os.path.join(os.path.dirname(f), "device.txt"), encoding="utf-8").read()
        h100 = "H100" in dev
        src = os.path.relpath(f, ROOT)
        pts = [
            BenchPoint(
                "smollm2-135m",
                "dense",
                int(d["ctx"]),
                int(r["conc"]),
                tpot_ms=float(r["tpot_ms"]),
                tok_s=float(r["decode_tok_s"]),
                bytes_per_step=0.0,
                decode=int(d["decode"]),
                engine="vllm",
                weights="real",
                decode_chain=1,
                hardware="h100-sxm" if h100 else "h200",
                device="NVIDIA H100 80GB HBM3" if h100 else "NVIDIA H200",
                kv_budget_gb=(80 if h100 else 141) * 0.9 - 1.0,  # gpu_memory_utilization 0.9 less the weights
                date=str(d.get("date", ""))[:10],
                commit=str(d.get("commit", ""))[:7],
                source=src,
                note="vLLM 0.26 on the real SmolLM2 weights (GGUF, bf16), the whole GPU: a floor probe",
            )
            for r in d["runs"]
        ]
        out.setdefault(f"vllm_floor_smollm2_{'h100' if h100 else 'h200'}.jsonl", []).extend(pts)
    return out


def heldout_points() -> dict:
    src = "DESIGN.md (../shared/DESIGN.md), 'Re-measured on 2026-12-04 (one call, 7e01859)'"
    kw = dict(date="2026-12-04", commit="7e01859", source=src)
    q = dict(model="qwen3-8b", kv_budget_gb=52.0, **kw)
    s = dict(model="smollm2-135m", context=7800, kv_budget_gb=3.0, weights="real", selection="model", **kw)
    t32 = 22 / 1828.0 * 1e3  # ms, from tok/s
    return {
        "qwen3_8b_7e01859.jsonl": [
            BenchPoint(mode="dense", engine="vllm", context=16384, lanes=16, tok_s=1122.5, decode_chain=1, **q),
            BenchPoint(mode="dense", engine="vllm", context=32768, lanes=10, tok_s=525.6, decode_chain=1, **q),
            BenchPoint(mode="lookahead", context=16384, lanes=48, tok_s=3430.0, note="victim cache S = 3K", **q),
            BenchPoint(mode="lookahead", context=32768, lanes=22, tok_s=1828.0, note="victim cache S = 3K", **q),
            BenchPoint(
                mode="lookahead",
                context=32768,
                lanes=22,
                tpot_ms=round(t32 / 1.113, 4),
                no_transfer=True,
                note="the twin, from the stated TPOT ratio 1.113 over 1,828 tok/s",
                **q,
            ),
        ],
        "smollm2_real_7e01859.jsonl": [
            BenchPoint(mode="dense", engine="vllm", lanes=16, tok_s=5502.0, decode_chain=1, **s),
            BenchPoint(mode="dense", lanes=15, tok_s=7405.0, **s),
            BenchPoint(mode="lookahead", lanes=50, top_k=128, tok_s=12103.0, **s),
            BenchPoint(mode="lookahead", lanes=82, top_k=64, tok_s=21279.0, **s),
        ],
    }


def heldout_h100_points() -> dict:
    """Held out on another card (``other_cards/qwen3_8b_h100.jsonl``, beside Gemma's H100 points): the H100 80GB runs of dummy Qwen3-8B at 16K x 44, 52 GB, K = 128,
    S = 3K that later calls made for other questions (2026-12-06): the block scorers' step-time call (1cd1217, the
    ``minmax`` row, decode chains of 8, 24 timed passes: the victim cache filled) and the speculative calls' k = 0
    runs and their no-transfer twins (e22264f, 486130b, chains of 1, 16 timed passes after 6: the victim cache still
    filling at the cap, 621 MB a step). The calibration is the H200's; these ask whether it carries to a card with
    70% of the H200's HBM bandwidth, bytes a step included."""
    hw = dict(model="qwen3-8b", hardware="h100-sxm", device="NVIDIA H100 80GB HBM3")
    pts = []
    src = "experiments/block_scorers/results/step_time_h100_1cd1217/bench.jsonl"
    first = json.loads(open(os.path.join(ROOT, src), encoding="utf-8").readline())  # the minmax row (bench_minmax.log)
    pts.append(point(src, first, warmup=first["warmup"], steps=first["steps"], note="block score minmax", **hw))
    for commit in ("e22264f", "486130b"):
        src = f"experiments/speculative_decoding/results/h100_{commit}/qwen.jsonl"
        for line in open(os.path.join(ROOT, src), encoding="utf-8"):
            d = json.loads(line)
            if d.get("run") in ("k0", "k0_nt"):
                pts.append(point(src, d, warmup=d["warmup"], steps=d["steps"], **hw))
    out = {"qwen3_8b_h100.jsonl": pts}
    for name, probes in vllm_floor_points().items():  # another card's floor probes past the knee: scored, not fitted
        rest = [p for p in probes if not card_admits(p, CARD)]
        if rest:
            out[name] = rest
    return out


def write(folder: str, files: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, pts in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8", newline="\n") as f:
            for p in pts:
                f.write(dumps_point(p) + "\n")
        print(f"{os.path.relpath(os.path.join(folder, name), ROOT)}: {len(pts)} points")


if __name__ == "__main__":
    base = os.path.join(ROOT, "traces", "bench_points")
    write(os.path.join(base, "train"), train_points())
    write(os.path.join(base, "heldout"), heldout_points())
    write(os.path.join(base, "other_cards"), heldout_h100_points())
