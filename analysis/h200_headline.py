"""Issue 5's headline at 16K and a 52 GB KV budget, in one process (the pinned host pool is pinned once).

    python analysis/h200_headline.py --out FILE.jsonl [--budget-s 150] [--steps 12] [--warmup 3] [--dry-run]

Runs ``oasis_exec.bench.run_bench`` for: dense at the budget's maximum (21 requests); lookahead at the largest
concurrency the host memory allows (tries ``--max-n`` candidates in order, 40 then 36, until one pins; 32 is run anyway);
lookahead at 32 and 16, each also with ``--no-transfer`` (issue 5 item 2: the same step without the copies); and,
last and only if the budget is left, a probe of a larger pool (``--probe-n``) to say where host memory binds.
Sparse runs are ordered largest pool first, so later ones reuse the registered pieces
(``oasis_exec.kv_store.pinned_pieces``). One JSON line per run (the bench record plus ``label``); a failed run
writes ``{"label", "status": "error", "error"}``. Labels already in ``--out`` with a result are skipped, so a
second invocation resumes after a crash. Prints a timestamped line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

BS = 16
CTX = 16384
UNIT = 36 * 8 * BS * 128 * 2 * 2  # one host block of Qwen3-8B: every layer and KV head, K and V, bf16


def host_gb(n: int, steps: int, warmup: int) -> float:
    blocks = -(-(CTX + steps + warmup) // BS)
    return round(n * (blocks + 1) * UNIT / 1e9 + 0.01, 3)


def plan(a) -> list:
    """[(label, kwargs for ExecConfig, concurrency, group)]; a group holds alternatives (first that runs wins)."""
    runs = [(f"dense-{a.dense_n}", dict(mode="dense"), a.dense_n, "dense")]
    for n in a.max_n:
        runs.append((f"lookahead-{n}", dict(mode="lookahead"), n, "max"))
    for n in [int(x) for x in a.la_n.split(",") if x]:
        runs.append((f"lookahead-{n}", dict(mode="lookahead"), n, f"la{n}"))
        runs.append((f"lookahead-{n}-notransfer", dict(mode="lookahead", no_transfer=True), n, f"nt{n}"))
    if a.probe_n:
        runs.append((f"lookahead-{a.probe_n}-probe", dict(mode="lookahead"), a.probe_n, "probe"))
    return runs


def est_s(kw, n, a) -> float:
    if kw["mode"] == "dense":
        return 8.0
    return 8.0 + host_gb(n, a.steps, a.warmup) / 2.7  # ~2.7 GB/s to pin (guest memory growth) when not reused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-n", type=lambda s: [int(x) for x in s.split(",")], default=[40, 36])
    ap.add_argument("--probe-n", type=int, default=44, help="0: no probe")
    ap.add_argument("--transfer", default="uva")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--kv-budget-gb", type=float, default=52.0)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test with --model tiny")
    ap.add_argument("--dense-n", type=int, default=21, help="dense at the budget's maximum (21 at 16K, 52 GB)")
    ap.add_argument("--la-n", default="32,16", help="lookahead concurrencies, each also with --no-transfer")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    global CTX, UNIT
    CTX = a.context
    from oasis_core.specs import get_model

    m = get_model(a.model)
    UNIT = m.n_layers * m.n_kv_heads * BS * m.head_dim * 2 * 2
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t0:5.0f}s] {msg}", flush=True)

    done, done_groups = set(), set()
    if os.path.exists(a.out):
        for line in open(a.out):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("status", "ok") == "ok":
                done.add(r["label"])
                done_groups.add(r.get("group"))
            elif "refused" in r.get("error", "") or "no request fits" in r.get("error", ""):
                done.add(r["label"])  # a refused pool stays refused: go to the next candidate
    runs = plan(a)
    for label, kw, n, group in runs:
        log(f"plan {label:<28} n={n:3d} host_kv_gb={host_gb(n, a.steps, a.warmup) if kw['mode'] != 'dense' else 0:7.2f}"
            f" ~{est_s(kw, n, a):.0f} s{' (done)' if label in done else ''}")
    if a.dry_run:
        return 0

    import gc

    import torch

    from oasis_exec.bench import run_bench
    from oasis_exec.config import ExecConfig

    max_ok = None
    for label, kw, n, group in runs:
        if label in done or group in done_groups:
            continue
        if group == "probe" and (max_ok is None or n <= max_ok):
            continue
        left = a.budget_s - (time.perf_counter() - t0)
        if group in ("probe",) and left < est_s(kw, n, a):
            log(f"budget: skip {label} ({left:.0f} s left)")
            continue
        if left < 10:
            log(f"budget: skip {label} ({left:.0f} s left)")
            continue
        sparse = kw["mode"] != "dense"
        cfg = ExecConfig(model=a.model, device=a.device, dtype="bfloat16" if a.device == "cuda" else "float32", selection="synthetic", top_k=128,
                         block_size=BS, fetch_ratio=0.05, max_context=CTX + a.warmup + a.steps + 2 * BS,
                         kv_budget_gb=a.kv_budget_gb, host_kv_gb=host_gb(n, a.steps, a.warmup) if sparse else None,
                         max_lanes=n, transfer=a.transfer if sparse else "auto", **kw)
        log(f"start {label}")
        t1 = time.perf_counter()
        try:
            rec = run_bench(cfg, CTX, n, a.steps, a.warmup, host_fill=False)
            rec.update(label=label, group=group, status="ok", wall_s=round(time.perf_counter() - t1, 1))
            if sparse and rec["concurrency"] < n:
                rec["status_note"] = f"admitted {rec['concurrency']} of {n}"
            done_groups.add(group)
            done.add(label)
            if group in ("max", "probe"):
                max_ok = max(max_ok or 0, rec["concurrency"])
            log(f"done  {label}: n={rec['concurrency']} tok/s={rec['throughput_tok_s']:.1f} "
                f"p50={rec['tpot_ms_p50']:.2f} ms MB/step={rec['bytes_moved_per_step'] / 1e6:.1f} "
                f"build={rec['build_s']:.1f} s wall={rec['wall_s']} s")
        except Exception as e:  # one failed configuration must not lose the others
            rec = {"label": label, "group": group, "status": "error", "concurrency": n,
                   "host_kv_gb": cfg.host_kv_gb, "wall_s": round(time.perf_counter() - t1, 1),
                   "error": " ".join(f"{type(e).__name__}: {e}".split())[:400]}
            log(f"FAIL  {label}: {rec['error']}")
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log("headline done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
