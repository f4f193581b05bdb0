"""Issue 16's study: each fetch-cap policy's cost on the executor (H200) and in the simulator, its quality on real
attention, and where it sits against ``Fixed(0.05)``.

    python experiments/fetch_policies/policy_study.py [--cost JSONL ...] [--quality JSON] [--out-dir DIR]

Inputs (defaults: the committed H200 results beside this script):

- ``--cost``: ``h200_headline.py --preset policies`` records (``steps/cost.sh``, ``steps/cost_bounds.sh``). Each
  sparse run with copies becomes an executor recording (``records_to_recordings.convert``, in ``DIR/recordings``)
  and is replayed in the simulator at the same point (closed loop, same concurrency, context, policy and synthetic
  parameters; an adaptive policy with exact per-step plans). Two predictors: the roofline, and the fitted predictor
  calibrated on the *static* policies' recordings of the same runs (fixed caps and unlimited; each scored one is left
  out of its own calibration), so every adaptive policy is predicted out of sample.
- ``--quality``: the ``quality endtoend`` JSON of ``../real_attention_quality/steps/policies.sh`` (real SmolLM2,
  trained draft head): perplexity, passkey and the context-shift figures per policy.

Writes ``policy_study.md`` (tables), ``policy_study.json`` and ``policy_study.png`` (per backend: throughput against
the 8K perplexity increase over dense, each policy a point, ``Fixed(0.05)`` marked; the Pareto front drawn).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core import provenance  # noqa: E402

RESULTS = os.path.join(HERE, "results")
DEFAULT_COST = [os.path.join(RESULTS, "cost.jsonl"), os.path.join(RESULTS, "cost_bounds.jsonl")]
DEFAULT_QUALITY = os.path.join(RESULTS, "policies_quality_h200.json")
BASE = "fixed:0.05"


def policy_of(cfg_or_rec: dict) -> str:
    """The policy a record or recording config ran: its ``fetch_policy`` or, unset, the fixed cap of its ratio."""
    spec = cfg_or_rec.get("fetch_policy")
    if spec:
        return spec
    r = float(cfg_or_rec.get("fetch_ratio", 0.05))
    return "unlimited" if r >= 1.0 else f"fixed:{r:g}"


def is_static(spec: str) -> bool:
    from oasis_core.fetchcap import get_policy

    return get_policy(spec).static


def cost_rows(paths, rec_dir: str, log=print) -> list:
    """One row per sparse executor run: measured, and the simulator's prediction by both predictors."""
    from experiments.simulator_vs_executor.records_to_recordings import convert
    from oasis_sim.validate import load_all, validate

    convert(paths, rec_dir, log=lambda m: None)
    recs = [r for r in load_all([rec_dir]) if r.config["mode"] != "dense"]
    static = [r for r in recs if is_static(policy_of(r.config))]
    log(f"{len(recs)} sparse recordings, {len(static)} of static policies (the fitted predictor's calibration)")
    rep = validate(recs, calibrate_from=static, progress=lambda n: log(f"  replayed {n}"))
    rows = []
    by = {p: {r["recording"]: r for r in rep["predictors"][p]["recordings"]} for p in ("roofline", "fitted")}
    for rec in recs:
        m_roof, m_fit = by["roofline"][rec.name]["metrics"], by["fitted"][rec.name]["metrics"]
        c = rec.config
        row = {
            "recording": rec.name,
            "policy": policy_of(c),
            "static": is_static(policy_of(c)),
            "context": c["context"],
            "concurrency": c["concurrency"],
            "commit": rec.results.get("commit"),  # the executor run's
        }
        for k in ("throughput_tok_s", "tpot_ms_p50", "pcie_h2d_bytes_per_step"):
            if k in m_fit:
                row[f"exec_{k}"] = m_fit[k]["measured"]
                row[f"roofline_{k}"] = m_roof[k]["predicted"]
                row[f"roofline_{k}_err_pct"] = m_roof[k]["err_pct"]
                row[f"fitted_{k}"] = m_fit[k]["predicted"]
                row[f"fitted_{k}_err_pct"] = m_fit[k]["err_pct"]
        rows.append(row)
    rows.sort(key=lambda r: (r["context"], r["policy"] != BASE, r["policy"]))
    return rows


QUALITY_KEYS = (
    "ppl_increase_pct",
    "shift_ppl_increase_pct",
    "passkey_acc",
    "shift_passkey_acc",
    "fetched_per_row_step",
    "missing_per_row_step",
)


def quality_rows(path: str) -> list:
    """Per (length, policy) of the sparse rows: perplexity and context-shift perplexity as increases over dense of
    the same length (%), passkey accuracies, blocks fetched and missing per row and step."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        q = json.load(f)
    rows = q.get("rows", [])
    dense = {r["n_tokens"]: r for r in rows if r.get("mode") == "dense"}
    out = []
    for r in rows:
        d = dense.get(r["n_tokens"])
        if r.get("mode") == "dense" or d is None or r.get("k_frac") == 1.0:
            continue
        pol = r.get("fetch_policy") or (
            "unlimited" if (r.get("fetch_ratio") or 0) >= 1.0 else f"fixed:{r['fetch_ratio']:g}"
        )
        row = {
            "length": r["n_tokens"],
            "mode": r["mode"],
            "policy": pol,
            "k_frac": r.get("k_frac"),
            "draft": r.get("draft"),
        }
        row["ppl_increase_pct"] = 100.0 * (r["ppl_all"] / d["ppl_all"] - 1.0)
        if r.get("shift_ppl") and d.get("shift_ppl"):
            row["shift_ppl_increase_pct"] = 100.0 * (r["shift_ppl"] / d["shift_ppl"] - 1.0)
        for k in ("passkey_acc", "shift_passkey_acc", "fetched_per_row_step", "missing_per_row_step"):
            row[k] = r.get(k)
        out.append(row)
    out.sort(key=lambda r: (r["length"], r["policy"] != BASE, r["policy"]))
    return out


def pareto(points):
    """Indices of the points no other point beats in both coordinates (higher x better, lower y better)."""
    idx = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i):
            idx.append(i)
    return idx


def _fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def write_md(out_dir: str, cost: list, quality: list, meta: dict) -> str:
    lines = [
        "# Fetch-cap policies on the executor and in the simulator (issue 16)",
        "",
        f"Generated by `experiments/fetch_policies/policy_study.py` at commit {meta['commit']}, {meta['date']}, on "
        f"{meta['machine']}. Executor figures: {meta['cost_sources']} (one NVIDIA H200, dummy Qwen3-8B weights, "
        "synthetic selection from the preset fitted to SmolLM2, `smollm2`; 52 GB KV budget, top-K 128, block 16, "
        "4 warm-up + 24 timed steps). Simulator: the same points replayed (`oasis_sim.replay`); *fitted* = calibrated "
        "on the static policies' runs only (each left out of its own fit), so every adaptive policy is out of sample.",
        "",
        "| context | n | policy | exec tok/s | exec TPOT p50 ms | exec MB/step | sim fitted tok/s | err % | "
        "sim roofline tok/s | err % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in cost:
        lines.append(
            f"| {r['context']} | {r['concurrency']} | {r['policy']}{'' if r['static'] else ' (adaptive)'} | "
            f"{_fmt(r.get('exec_throughput_tok_s'))} | {_fmt(r.get('exec_tpot_ms_p50'), 2)} | "
            f"{_fmt((r.get('exec_pcie_h2d_bytes_per_step') or 0) / 1e6)} | {_fmt(r.get('fitted_throughput_tok_s'))} | "
            f"{_fmt(r.get('fitted_throughput_tok_s_err_pct'))} | {_fmt(r.get('roofline_throughput_tok_s'))} | "
            f"{_fmt(r.get('roofline_throughput_tok_s_err_pct'))} |"
        )
    if quality:
        lines += [
            "",
            f"Quality on real attention ({meta['quality_source']}: SmolLM2-135M from its GGUF, **real** weights, the "
            "trained draft head, the model's own selections, bf16 on one H200; K = 12.5% of the blocks; perplexity "
            "teacher-forced over 255 tokens of each text; the context shift: a new document of N/4 tokens fed during "
            "decoding, its perplexity and the pass key hidden in it; increases are over dense at the same length):",
            "",
            "| length | policy | ppl increase % | shift ppl increase % | passkey | shift passkey | fetched / row / step "
            "| missing / row / step |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in quality:
            lines.append(
                f"| {r['length']} | {r['policy']} | " + " | ".join(_fmt(r.get(k), 2) for k in QUALITY_KEYS) + " |"
            )
    path = os.path.join(out_dir, "policy_study.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def plot(out_dir: str, cost: list, quality: list, ctx: int = 16384):
    """Throughput (x) against the 8K perplexity increase (y) per policy, one panel per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ppl = {r["policy"]: r["ppl_increase_pct"] for r in quality if r["mode"] == "lookahead" and r["length"] == 8192}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (name, key) in zip(
        axes, (("executor (H200)", "exec_throughput_tok_s"), ("simulator (fitted)", "fitted_throughput_tok_s"))
    ):
        pts = [
            (r[key], ppl[r["policy"]], r["policy"])
            for r in cost
            if r["context"] == ctx and r.get(key) and r["policy"] in ppl
        ]
        if not pts:
            ax.set_title(f"{name}: no points with quality")
            continue
        front = set(pareto([(x, y) for x, y, _ in pts]))
        for i, (x, y, p) in enumerate(pts):
            ax.scatter(
                [x],
                [y],
                marker="*" if p == BASE else "o",
                s=120 if p == BASE else 40,
                color="C1" if i in front else "C0",
            )
            ax.annotate(p, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        f = sorted(pts[i] for i in front)
        ax.plot([x for x, _, _ in f], [y for _, y, _ in f], color="C1", lw=1)
        ax.set_title(f"{name}, {ctx // 1024}K context")
        ax.set_xlabel("decode throughput, tok/s")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("8K perplexity increase over dense, %")
    fig.tight_layout()
    path = os.path.join(out_dir, "policy_study.png")
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cost", nargs="+", default=DEFAULT_COST, help="h200_headline --preset policies records")
    ap.add_argument("--quality", default=DEFAULT_QUALITY, help="quality endtoend JSON of steps/policies.sh")
    ap.add_argument("--out-dir", default=RESULTS)
    a = ap.parse_args(argv)
    missing = [p for p in a.cost if not os.path.exists(p)]
    if missing:
        print(f"policy_study: no such cost file: {missing[0]}", file=sys.stderr)
        return 2
    os.makedirs(a.out_dir, exist_ok=True)
    meta = {
        "commit": provenance.commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node() or 'cpu'} ({os.cpu_count()} CPUs; the simulator's side)",
        "cost_sources": ", ".join(os.path.relpath(p, REPO) for p in a.cost),
        "quality_source": os.path.relpath(a.quality, REPO) if a.quality and os.path.exists(a.quality) else None,
    }
    cost = cost_rows(a.cost, os.path.join(a.out_dir, "recordings"))
    quality = quality_rows(a.quality)
    with open(os.path.join(a.out_dir, "policy_study.json"), "w") as f:
        json.dump({"meta": meta, "cost": cost, "quality": quality}, f, indent=1)
    print(write_md(a.out_dir, cost, quality, meta))
    print(plot(a.out_dir, cost, quality))
    return 0


if __name__ == "__main__":
    sys.exit(main())
