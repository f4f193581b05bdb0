"""Record the executor's validation matrix on the GPU, in one process, within a time budget.

    python experiments/simulator_vs_executor/record_matrix.py --out traces/recordings [--steps 24] [--warmup 4] [--budget-s 540]
    python experiments/simulator_vs_executor/record_matrix.py --dry-run          # the plan and the time estimate only (no torch needed)
    python experiments/simulator_vs_executor/record_matrix.py --no-profile ...   # graph mode: whole-step CUDA graphs, no stage times
    python experiments/simulator_vs_executor/record_matrix.py --device cpu --model tiny --hardware h200 --contexts 64 --concurrency 2 \
        --transfer host --out /tmp/rec                  # CPU smoke test of the whole path

Matrix (issue 7): concurrency {8, 16, 32, 64} x context {8K, 16K, 32K} for ``dense`` and ``lookahead`` (fetch
ratio 0.05), plus ``lookahead`` at fetch ratios 0.02 and 0.10 at the contexts of ``--fr-contexts`` (default 16K;
``all`` for every context). Each run is ``oasis_exec.tools.bench.run_bench`` (closed loop, synthesized prefill, dummy
weights, synthetic selection by default; ``--profile`` stage timing unless ``--no-profile``) and is written at once as
``<out>/<label>.json`` with ``oasis_exec.tools.recorder`` (a few KB: summaries and sampled steps). Existing recordings
are skipped unless ``--overwrite``, so a matrix cut short by the budget resumes where it stopped on the next call.

Bounded time: before starting, the script prints a per-run estimate (build: model + pinned host pool; steps:
an analytic step time x ``--slowdown``) and the total; runs are ordered cheapest first; a run whose estimate would
overrun ``--budget-s`` (measured from the script's start) is skipped and listed, never killed midway. After each
run the estimate of the rest is rescaled by how far the measured runs were from their estimates.

Memory: dense runs get ``--kv-budget-gb`` of HBM for KV (the executor admits fewer requests than asked when the
budget is short: the recording keeps both numbers); sparse runs pin a host pool of what the batch needs, capped at
``--max-host-gb`` (pinning costs ~2.5 GB/s here), which again lowers the admitted concurrency of the largest
configurations; a run that would admit the same number of requests as a smaller one of the same mode, context
and fetch ratio is skipped as a duplicate.

Profiled or not: ``--profile`` (the default) puts CUDA events around every layer's stages, which turns the
executor's CUDA graphs off, so the steps are eager and launch-bound (the 2026-11-30 recordings: 2.5-6.4x slower
than the engine's real, graph-captured step). ``--no-profile`` records the engine as it serves: whole-step CUDA
graphs; the recording then has TPOT p50/p99, throughput, the sampled step durations and the bytes per link, but no
per-stage times (``stage_ms_per_step`` empty; ``oasis_sim.fitted`` falls back to the TPOT for its compute target). A log of every run (status, wall time, estimate) goes to ``<out>/_matrix_log.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core.geometry import KVGeometry  # noqa: E402
from oasis_core.recording import label  # noqa: E402
from oasis_core.specs import get_hardware, get_model  # noqa: E402

CONCURRENCY = (8, 16, 32, 64)
CONTEXTS = (8192, 16384, 32768)
FETCH_RATIOS = (0.02, 0.05, 0.10)
DEFAULT_FR = 0.05


def plan(fr_contexts="16384", modes=("dense", "lookahead"), contexts=CONTEXTS, concurrency=CONCURRENCY) -> list:
    """[(mode, context, concurrency, fetch_ratio)] of the matrix."""
    runs = []
    for mode in modes:
        for ctx in contexts:
            for n in concurrency:
                runs.append((mode, ctx, n, DEFAULT_FR))
    if "lookahead" in modes:
        ctxs = contexts if fr_contexts == "all" else tuple(int(c) for c in fr_contexts.split(",") if c)
        for ctx in ctxs:
            for n in concurrency:
                for fr in FETCH_RATIOS:
                    if fr != DEFAULT_FR:
                        runs.append(("lookahead", ctx, n, fr))
    return runs


def host_gb(mode, ctx, n, steps, warmup, geo, cap_gb) -> float:
    if mode == "dense":
        return 0.0
    need = n * (ctx + steps + warmup + 2 * geo.block_size) * geo.bytes_per_token * 1.02 / 1e9
    return round(min(need, cap_gb), 4)


def admitted(mode, ctx, n, a, geo) -> int:
    """Requests the executor will run together: what the KV budget (dense) or the host pool (sparse) holds."""
    per_req = (ctx + a.steps + a.warmup + 2 * geo.block_size) * geo.bytes_per_token
    if mode == "dense":
        return max(0, min(n, int(a.kv_budget_gb * 1e9 // per_req)))
    pool = host_gb(mode, ctx, n, a.steps, a.warmup, geo, a.max_host_gb) * 1e9
    return max(0, min(n, int(pool // (per_req * 1.0))))


def estimate_s(mode, ctx, n, fr, a, geo, hw) -> float:
    """Wall seconds of one run: build (model init + pinning the host pool) + (warmup + steps) x step time."""
    L = geo.model.n_layers
    bpt_layer = geo.bytes_per_token / L
    n = admitted(mode, ctx, n, a, geo)
    if mode == "dense":
        kv = n * ctx * bpt_layer
    else:
        kv = n * min(ctx, (128 + 1) * geo.block_size) * bpt_layer
    attn = kv / (hw.measured_attn_read_bytes_per_s or hw.hbm_bytes_per_s * 0.9)
    step = L * (0.15e-3 + attn) + 1e-3
    if mode != "dense":  # the prefetch: ~fr x K blocks per head and layer, at ~30 GB/s, partly hidden
        step += n * L * geo.model.n_kv_heads * fr * 128 * geo.bytes_per_block_head / 30e9 * 0.3
    pin = 0.0 if a.prepin else host_gb(mode, ctx, n, a.steps, a.warmup, geo, a.max_host_gb) / 2.5
    build = 3.0 + pin  # with --prepin the pool is pinned once up front (counted in the total, not per run)
    return build + (a.steps + a.warmup) * step * a.slowdown


def exec_config(mode, ctx, n, fr, a, geo):
    from oasis_exec.config import ExecConfig

    sparse = mode != "dense"
    return ExecConfig(
        model=a.model,
        device=a.device,
        dtype="bfloat16" if a.device == "cuda" else "float32",
        mode=mode,
        selection=a.selection,
        top_k=128,
        block_size=geo.block_size,
        fetch_ratio=fr,
        max_context=ctx + a.warmup + a.steps + 2 * geo.block_size,
        kv_budget_gb=a.kv_budget_gb,
        host_kv_gb=host_gb(mode, ctx, n, a.steps, a.warmup, geo, a.max_host_gb) if sparse else None,
        max_lanes=n,
        transfer=a.transfer,
        seed=a.seed,
        profile=not a.no_profile,
        decode_chain=1,  # recordings replay one decode step a scheduler step
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="record the sim-vs-exec validation matrix on the GPU")
    ap.add_argument("--out", default=os.path.join(REPO, "traces", "recordings"))
    ap.add_argument("--steps", type=int, default=24, help="timed decode steps per run")
    ap.add_argument("--warmup", type=int, default=4, help="untimed decode steps per run")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting runs past this (device limit 600)")
    ap.add_argument("--startup-s", type=float, default=25.0, help="estimate of imports + CUDA init")
    ap.add_argument("--slowdown", type=float, default=4.0, help="executor step time / analytic estimate (initial)")
    ap.add_argument("--kv-budget-gb", type=float, default=100.0)
    ap.add_argument("--max-host-gb", type=float, default=64.0, help="cap on the pinned host pool of one run")
    ap.add_argument(
        "--fr-contexts", default="16384", help="contexts of the fetch-ratio sweep: '16384', '8192,32768' or 'all'"
    )
    ap.add_argument("--modes", default="dense,lookahead")
    ap.add_argument("--only", default=None, help="regex over run labels (e.g. 'lookahead-16k')")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--selection", default="synthetic", help="synthetic (dummy weights) | model")
    ap.add_argument("--transfer", default="host", help="host | uva")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-profile",
        action="store_true",
        help="no per-stage CUDA events (no stage times): CUDA graphs on, the engine's real step",
    )
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="contexts of the matrix")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="concurrencies of the matrix")
    ap.add_argument("--device", default="cuda", help="cuda | cpu (a smoke test: --model tiny --hardware h200)")
    ap.add_argument(
        "--hardware", default=None, help="simulator preset of the recordings (default: from the device name)"
    )
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument(
        "--no-host-fill",
        action="store_true",
        help="leave the pinned host pool unwritten (copies time the same; saves a pass over it per run)",
    )
    ap.add_argument(
        "--prepin",
        action="store_true",
        help="pin the largest host pool of the plan once, before the "
        "runs (oasis_exec.kv.store reuses it for every run)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, run nothing")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()

    model = get_model(a.model)
    geo = KVGeometry(model, 16)
    hw = get_hardware("h200")
    runs = []
    seen = {}
    contexts = tuple(int(c) for c in a.contexts.split(",") if c)
    concurrency = tuple(int(c) for c in a.concurrency.split(",") if c)
    for mode, ctx, n, fr in plan(a.fr_contexts, tuple(a.modes.split(",")), contexts, concurrency):
        name = label({"mode": mode, "context": ctx, "concurrency": n, "fetch_ratio": fr})
        if a.only and not re.search(a.only, name):
            continue
        eff = admitted(mode, ctx, n, a, geo)
        if eff < 1:
            print(f"skip {name}: not even one request fits (--kv-budget-gb / --max-host-gb)")
            continue
        if (mode, ctx, fr, eff) in seen:
            print(f"skip {name}: admits {eff} requests, the same as {seen[mode, ctx, fr, eff]}")
            continue
        seen[mode, ctx, fr, eff] = name
        path = os.path.join(a.out, name + ".json")
        if os.path.exists(path) and not a.overwrite:
            print(f"skip {name}: {path} exists (--overwrite to redo)")
            continue
        runs.append((estimate_s(mode, ctx, n, fr, a, geo, hw), name, path, mode, ctx, n, fr))
    runs.sort()
    pin_s = 0.0
    if a.prepin:
        pin_s = max([host_gb(r[3], r[4], r[5], a.steps, a.warmup, geo, a.max_host_gb) for r in runs] + [0.0]) / 2.5
    total = a.startup_s + pin_s + sum(r[0] for r in runs)
    print(
        f"{len(runs)} runs, {a.warmup} + {a.steps} steps each; estimated {total:.0f} s "
        f"(budget {a.budget_s:.0f} s, slowdown x{a.slowdown:g} over the analytic step time"
        f"{f', prepin ~{pin_s:.0f} s' if pin_s else ''}; {'graphs, no stage times' if a.no_profile else 'profiled'})",
        flush=True,
    )
    for est, name, *_rest in runs:
        print(f"  {name:<28} ~{est:6.1f} s")
    if a.dry_run:
        return 0

    import gc

    import torch

    from oasis_exec.tools.bench import run_bench
    from oasis_exec.tools.recorder import write_bench_recording

    os.makedirs(a.out, exist_ok=True)
    if a.prepin and a.device == "cuda":
        sparse_gb = [host_gb(r[3], r[4], r[5], a.steps, a.warmup, geo, a.max_host_gb) for r in runs if r[3] != "dense"]
        if sparse_gb:
            from oasis_exec.kv.store import pinned_pieces

            t_pin = time.perf_counter()
            unit = geo.bytes_per_token * geo.block_size  # one host block: every layer and head, K and V
            blocks = int(max(sparse_gb) * 1e9 // unit)
            try:
                pinned_pieces(2 * model.n_layers, blocks * int(unit // (2 * model.n_layers)))
                print(f"prepinned {blocks * unit / 1e9:.1f} GB in {time.perf_counter() - t_pin:.1f} s", flush=True)
            except Exception as e:
                print(f"prepin failed ({e}); runs pin their own pools", flush=True)
    log_path = os.path.join(a.out, "_matrix_log.jsonl")
    ratio_num = ratio_den = 0.0
    skipped = []
    for est, name, path, mode, ctx, n, fr in runs:
        scale = (ratio_num / ratio_den) if ratio_den else 1.0
        elapsed = time.perf_counter() - t_start
        if elapsed + est * scale > a.budget_s:
            skipped.append(name)
            print(f"budget: skip {name} (~{est * scale:.0f} s, {elapsed:.0f} s used)", flush=True)
            continue
        t0 = time.perf_counter()
        entry = {"run": name, "estimate_s": round(est * scale, 1)}
        try:
            cfg = exec_config(mode, ctx, n, fr, a, geo)
            bench = run_bench(cfg, ctx, n, a.steps, a.warmup, host_fill=not a.no_host_fill)
            rec = write_bench_recording(
                path,
                bench,
                cfg,
                hardware=a.hardware,
                meta={
                    "made_by": "experiments/simulator_vs_executor/record_matrix.py",
                    "cuda_graph": bool(cfg.cuda_graph and not cfg.profile),
                },
            )
            entry.update(status="ok", concurrency=rec.config["concurrency"], tpot_ms_p50=bench["tpot_ms_p50"])
        except Exception as e:  # one failed configuration must not lose the others
            entry.update(status="error", error=" ".join(f"{type(e).__name__}: {e}".split())[:300])
        wall = time.perf_counter() - t0
        entry["wall_s"] = round(wall, 1)
        ratio_num += wall
        ratio_den += est
        print(json.dumps(entry), flush=True)
        with open(log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped {len(skipped)}: {' '.join(skipped) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
