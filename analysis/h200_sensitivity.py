"""Issue 5 item 4's sensitivity at 16K and a 52 GB KV budget, graph mode, in one process (the host pool pinned once).

    python analysis/h200_sensitivity.py --out FILE.jsonl [--budget-s 90] [--steps 16] [--warmup 4] [--dry-run]
    python analysis/h200_sensitivity.py --out /tmp/s.jsonl --device cpu --model tiny --context 64 --n 2,1  # smoke

Runs ``oasis_exec.bench.run_bench`` (dummy weights, synthetic selection, UVA transfer, whole-step CUDA graphs: no
``--profile``) for ``lookahead`` at each concurrency of ``--n`` (default 32, then 16 if the budget is left):

- ``base``: the synthetic defaults (drift_rate 0.12), fetch ratio 0.05 -- the same-call reference;
- ``drift2``: drift_rate 0.24 (doubled; fits the default drift_zone 0.25);
- ``drift4``: drift_rate 0.48 (quadrupled), with drift_zone raised to 0.48, the least that
  ``SyntheticParams`` accepts for it (drift happens only inside the zone: drift_rate <= drift_zone);
- ``fr0.02`` and ``fr0.1``: fetch ratios 0.02 and 0.10 at the default drift;

and ``dense`` at the budget's maximum (21 requests at 16K) after the first concurrency's lookahead runs, so every
ratio is same-call. One JSON line per run (the bench record plus ``label``, ``variant``, ``status``); a failed run
writes ``{"label", "status": "error", "error"}``; labels already in ``--out`` with ``status`` ok are skipped, so a
second invocation resumes after a crash. The largest pool is pinned first, so later runs reuse its pieces
(``oasis_exec.kv_store.pinned_pieces``).
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
DEFAULT_DRIFT = 0.12
VARIANTS = (  # name, fetch ratio, SyntheticParams overrides (None = the defaults)
    ("base", 0.05, None),
    ("drift2", 0.05, {"drift_rate": 2 * DEFAULT_DRIFT}),
    ("drift4", 0.05, {"drift_rate": 4 * DEFAULT_DRIFT, "drift_zone": 4 * DEFAULT_DRIFT}),
    ("fr0.02", 0.02, None),
    ("fr0.1", 0.10, None),
)


def host_gb(n: int, ctx: int, steps: int, warmup: int, unit: int) -> float:
    blocks = -(-(ctx + steps + warmup) // BS)
    return round(n * (blocks + 1) * unit / 1e9 + 0.01, 4)


def plan(a) -> list:
    """[(label, ExecConfig overrides, concurrency, variant)] in run order."""
    runs = []
    for i, n in enumerate(a.n):
        for name, fr, syn in VARIANTS:
            runs.append((f"lookahead-{n}-{name}", dict(mode="lookahead", fetch_ratio=fr, synthetic=syn), n, name))
        if i == 0 and a.dense_n:
            runs.append((f"dense-{a.dense_n}", dict(mode="dense", fetch_ratio=0.05, synthetic=None), a.dense_n,
                         "dense"))
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=90.0, help="start no run past this (seconds from start)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--n", type=lambda s: [int(x) for x in s.split(",") if x], default=[32, 16],
                    help="lookahead concurrencies, in order")
    ap.add_argument("--dense-n", type=int, default=21, help="dense at the budget's maximum (21 at 16K, 52 GB); 0: none")
    ap.add_argument("--transfer", default="uva")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--kv-budget-gb", type=float, default=52.0)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test with --model tiny")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    from oasis_core.specs import get_model

    m = get_model(a.model)
    unit = m.n_layers * m.n_kv_heads * BS * m.head_dim * 2 * 2  # one host block: every layer and KV head, K and V
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t0:5.0f}s] {msg}", flush=True)

    done = set()
    if os.path.exists(a.out):
        for line in open(a.out):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("status") == "ok":
                done.add(r["label"])
    runs = plan(a)
    for label, kw, n, variant in runs:
        gb = host_gb(n, a.context, a.steps, a.warmup, unit) if kw["mode"] != "dense" else 0.0
        log(f"plan {label:<26} n={n:3d} fr={kw['fetch_ratio']:.2f} synthetic={kw['synthetic']} host_kv_gb={gb:.2f}"
            f"{' (done)' if label in done else ''}")
    if a.dry_run:
        return 0

    import gc

    import torch

    from oasis_exec.bench import run_bench
    from oasis_exec.config import ExecConfig

    # the largest pool of the plan is built by its first sparse run (a.n[0]); smaller ones reuse its pieces
    for label, kw, n, variant in runs:
        if label in done:
            continue
        left = a.budget_s - (time.perf_counter() - t0)
        if left < 5:
            log(f"budget: skip {label} ({left:.0f} s left)")
            continue
        sparse = kw["mode"] != "dense"
        cfg = ExecConfig(model=a.model, device=a.device, dtype="bfloat16" if a.device == "cuda" else "float32",
                         selection="synthetic", top_k=128, block_size=BS,
                         max_context=a.context + a.warmup + a.steps + 2 * BS, kv_budget_gb=a.kv_budget_gb,
                         host_kv_gb=host_gb(n, a.context, a.steps, a.warmup, unit) if sparse else None,
                         max_lanes=n, transfer=a.transfer if sparse else "auto", **kw)
        log(f"start {label}")
        t1 = time.perf_counter()
        try:
            rec = run_bench(cfg, a.context, n, a.steps, a.warmup, host_fill=False)
            rec.update(label=label, variant=variant, status="ok", wall_s=round(time.perf_counter() - t1, 1),
                       cuda_graph=bool(cfg.cuda_graph and not cfg.profile),
                       drift_rate=(kw["synthetic"] or {}).get("drift_rate", DEFAULT_DRIFT) if sparse else None)
            if rec["concurrency"] < n:
                rec["status_note"] = f"admitted {rec['concurrency']} of {n}"
            done.add(label)
            log(f"done  {label}: n={rec['concurrency']} tok/s={rec['throughput_tok_s']:.1f} "
                f"p50={rec['tpot_ms_p50']:.2f} p99={rec['tpot_ms_p99']:.2f} ms "
                f"MB/step={rec['bytes_moved_per_step'] / 1e6:.1f} missing/step={rec['drift_blocks_per_step']:.0f} "
                f"build={rec['build_s']:.1f} s wall={rec['wall_s']} s")
        except Exception as e:  # one failed configuration must not lose the others
            rec = {"label": label, "variant": variant, "status": "error", "concurrency": n,
                   "host_kv_gb": cfg.host_kv_gb, "wall_s": round(time.perf_counter() - t1, 1),
                   "error": " ".join(f"{type(e).__name__}: {e}".split())[:400]}
            log(f"FAIL  {label}: {rec['error']}")
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log("sensitivity done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
