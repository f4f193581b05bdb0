"""Simulator vs executor: the validation table and the predicted-vs-measured plot from the committed recordings.

    python experiments/simulator_vs_executor/sim_vs_exec.py [--recordings traces/recordings] [--out DIR (default: results/ beside this script)] [--out-prefix NAME]
        [--calibrate-from DIR] [--control DIR] [--twins JSONL ...] [--set-aside NAME ...] [--causes FILE]

Writes ``sim_vs_exec.md``, ``sim_vs_exec.json`` (the full ``oasis_sim.validate`` report plus the flagged
configurations) and ``sim_vs_exec.png`` (predicted against measured TPOT p50 and throughput, roofline and fitted
predictor, with the ±5% band). The fitted predictor is scored leave-one-out: each recording by a model fitted on
all the others. With no recordings it says so in the .md/.json and draws nothing.

A configuration whose TPOT p50 or throughput error exceeds 10% (either predictor) is listed with the stage whose
predicted time is furthest from its measured time (ms per step) -- a pointer for finding the cause, which is then
written down by hand in ``experiments/simulator_vs_executor/sim_vs_exec_causes.md`` (``--causes``), which the .md includes as its section
"Causes". ``--out-prefix`` names the outputs (``NAME.md``, ``.json``, ``.png``; default ``sim_vs_exec``).

**Against an earlier calibration** (``--calibrate-from DIR``, e.g. the recordings of an older executor): the report
then scores five predictors -- the roofline; the fitted predictor leave-one-out; leave-config-out (fitted without
every recording of the scored one's configuration: mode, context, concurrency, fetch ratio, synthetic parameters,
so repeated runs of one configuration, at two commits or with other UVA program counts, do not score each other);
in-sample (one model fitted on all of them: the fit structure's own residual, not a prediction); and the old fit
(fitted on ``DIR`` only, not refitted: how stale that calibration is) -- with signed errors, a breakdown by group
(mode, variant, commit), the worst configurations and the two models' parameters side by side. ``--control DIR``:
recordings of another executor (e.g. fused-off twins) scored by the old fit alone. ``--twins JSONL ...``: bench
records holding no-transfer twins (``no_transfer``: selections planned, copies skipped); each is paired with the
record of the same configuration that copied, giving the step time the copies cost (:func:`copy_cost_from_twins`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core import provenance as prov  # noqa: E402
from oasis_core.recording import find_recordings  # noqa: E402
from oasis_core.specs import get_model  # noqa: E402
from oasis_sim import validate as V  # noqa: E402
from oasis_sim.fitted import fit, recording_key, sample_of  # noqa: E402
from oasis_sim.replay import replay  # noqa: E402

HEADLINE = ("tpot_ms_p50", "throughput_tok_s")
DEFAULT_CAUSES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_vs_exec_causes.md")
STAGES = (
    "layer_ms_layers",
    "layer_ms_gemm",
    "layer_ms_attn",
    "layer_ms_pred",
    "layer_ms_select",
    "layer_ms_transfer",
    "stall_ms_per_step",
)


def flagged(report: dict, limit_pct: float = 10.0, predictors=None) -> list:
    out = []
    for p in predictors or V.PREDICTORS:
        for row in report["predictors"][p]["recordings"]:
            m = row["metrics"]
            bad = {
                k: m[k]["err_pct"]
                for k in HEADLINE
                if k in m and m[k]["err_pct"] is not None and abs(m[k]["err_pct"]) > limit_pct
            }
            if not bad:
                continue
            worst, worst_ms = None, 0.0
            n_layers = get_model(row["config"]["model"]).n_layers
            for k in STAGES:
                if k in m and m[k]["measured"] is not None and m[k]["predicted"] is not None:
                    scale = 1.0 if k == "stall_ms_per_step" else n_layers  # per layer -> per step
                    d = (m[k]["predicted"] - m[k]["measured"]) * scale
                    if abs(d) > abs(worst_ms):
                        worst, worst_ms = k, d
            out.append(
                {
                    "predictor": p,
                    "recording": row["recording"],
                    "errors_pct": bad,
                    "largest_stage_gap": worst,
                    "largest_stage_gap_ms_per_step": worst_ms,
                }
            )
    return out


def _f(v, nd=1):
    return "-" if v is None else f"{v:,.{nd}f}"


def markdown(
    report: dict,
    flags: list,
    recordings_rel: str = "traces/recordings",
    prefix: str = "sim_vs_exec",
    causes: str = None,
) -> str:
    L = [
        "# Simulator vs executor",
        "",
        f"{report['n_recordings']} recordings from `{recordings_rel}/`. Fitted predictor: {report['note']}.",
        "",
        "## Error summary (absolute % error over recordings: median / p90)",
        "",
        "| metric | roofline | fitted (leave-one-out) |",
        "| --- | --- | --- |",
    ]
    for s in V.SHORT.values():
        cells = []
        for p in V.PREDICTORS:
            sm = report["predictors"][p]["summary"]
            med = sm[f"median_abs_err_pct_{s}"]
            cells.append("-" if med is None else f"{med:.1f} / {sm[f'p90_abs_err_pct_{s}']:.1f} (n={sm[f'n_{s}']})")
        if cells != ["-", "-"]:
            L.append(f"| {s} | {cells[0]} | {cells[1]} |")
    L += [
        "",
        "## Per recording",
        "",
        "| recording | TPOT p50 ms measured | roofline | err % | fitted | err % | tok/s measured | roofline | "
        "err % | fitted | err % |",
        "| --- | " + "--- | " * 10,
    ]
    roof, fit = (report["predictors"][p]["recordings"] for p in V.PREDICTORS)
    for a, b in zip(roof, fit):
        cells = [a["recording"]]
        for k in HEADLINE:
            ma, mb = a["metrics"][k], b["metrics"][k]
            nd = 2 if k == "tpot_ms_p50" else 0
            cells += [
                _f(ma["measured"], nd),
                _f(ma["predicted"], nd),
                _f(ma["err_pct"]),
                _f(mb["predicted"], nd),
                _f(mb["err_pct"]),
            ]
        L.append("| " + " | ".join(cells) + " |")
    L += ["", "## Configurations above 10% error", ""]
    if not flags:
        L.append("None.")
    else:
        L += [
            "| predictor | recording | errors % | stage furthest off | predicted - measured, ms/step |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in flags:
            errs = ", ".join(f"{k} {v:+.1f}" for k, v in f["errors_pct"].items())
            L.append(
                f"| {f['predictor']} | {f['recording']} | {errs} | {f['largest_stage_gap'] or '-'} | "
                f"{_f(f['largest_stage_gap_ms_per_step'], 2)} |"
            )
        causes = causes or DEFAULT_CAUSES  # written by hand after inspection
        if os.path.exists(causes):
            with open(causes) as f:
                L += ["", f.read().rstrip()]
        else:
            L += [
                "",
                "## Causes",
                "",
                "(to be written after inspecting the flagged configurations: the stage gap "
                "above is where to start; compare `python -m oasis_sim replay` timelines with the executor's; "
                "put them in experiments/simulator_vs_executor/sim_vs_exec_causes.md)",
            ]
    L += ["", f"![predicted vs measured]({prefix}.png)", ""]
    return "\n".join(L)


def plot(report: dict, path: str, predictors=None, suptitle=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, k, title in zip(axes, HEADLINE, ("TPOT p50 (ms)", "throughput (tok/s)")):
        lo, hi = float("inf"), 0.0
        for p, marker in zip(predictors or V.PREDICTORS, ("x", "o", "^", "s", "v")):
            pts = [
                (r["metrics"][k]["measured"], r["metrics"][k]["predicted"])
                for r in report["predictors"][p]["recordings"]
                if r["metrics"][k]["measured"] and r["metrics"][k]["predicted"]
            ]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, marker=marker, label=p, alpha=0.8)
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        if hi > 0:
            grid = [lo * 0.8, hi * 1.2]
            ax.plot(grid, grid, "k-", lw=0.8)
            ax.fill_between(
                grid, [g * 0.95 for g in grid], [g * 1.05 for g in grid], color="gray", alpha=0.2, label="±5%"
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"predicted {title}")
        ax.legend()
    fig.suptitle(suptitle or "OasisKV simulator vs H200 executor recordings (fitted: leave-one-out)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# Against an earlier calibration (--calibrate-from): five predictors, groups, parameters, twins, control

EXT_PREDICTORS = ("roofline", "fitted_loo", "fitted_lco", "fitted_in_sample", "old_fit")
EXT_NAMES = {
    "roofline": "roofline",
    "fitted_loo": "fitted, leave-one-out",
    "fitted_lco": "fitted, leave-config-out",
    "fitted_in_sample": "fitted in-sample (training residual)",
    "old_fit": "old fit (not refitted)",
}
SIGNED = ("tpot_ms_p50", "tpot_ms_p99", "throughput_tok_s")
KEPT_METRICS = SIGNED + ("pcie_h2d_bytes_per_step", "stall_ms_per_step")


def config_key(rec) -> tuple:
    """What the simulator can tell apart: two recordings with the same key are the same simulated run."""
    c = rec.config
    return (
        c["mode"],
        c["context"],
        c["concurrency"],
        c["fetch_ratio"] if c["mode"] != "dense" else None,
        json.dumps(c.get("synthetic") or {}, sort_keys=True),
    )


def group_of(rec) -> str:
    m, c = rec.trace.meta, rec.config
    if c["mode"] == "dense":
        return "dense"
    if m.get("bench_role") == "transfer":
        return "lookahead, UVA program variants"
    if m.get("bench_variant") not in (None, "base"):
        return "lookahead, drift / fetch-ratio variants"
    return "lookahead"


def _median(xs):
    import numpy as np

    return float(np.median(xs)) if xs else None


def _p90(xs):
    import numpy as np

    return float(np.percentile(xs, 90)) if xs else None


def summarize(rows: list) -> dict:
    """``V._aggregate`` (median / p90 of |err|) plus the signed median (bias) of the headline metrics."""
    out = V._aggregate(rows)
    for k in SIGNED:
        errs = [
            r["metrics"][k]["err_pct"] for r in rows if k in r["metrics"] and r["metrics"][k]["err_pct"] is not None
        ]
        out[f"median_signed_err_pct_{V.SHORT[k]}"] = _median(errs)
    return out


def _rows(recs, preds, extra=None) -> list:
    return [
        dict(
            {
                "recording": r.name,
                "config": r.config,
                "group": group_of(r),
                "commit": r.results["commit"],
                "metrics": V._row(r, p),
            },
            **(extra[i] if extra else {}),
        )
        for i, (r, p) in enumerate(zip(recs, preds))
    ]


def provenance(recs, pool, command=None) -> dict:
    dirty = prov.status(("oasis_sim", "oasis_core", "experiments/simulator_vs_executor/sim_vs_exec.py"))
    return {
        "date": datetime.date.today().isoformat(),
        "analysis_commit": prov.commit(),
        "analysis_tree_dirty": bool(dirty),
        "record_commits": sorted({r.results["commit"] for r in recs}),
        "record_dates": sorted({r.results["date"][:10] for r in recs}),
        "calibration_commits": sorted({r.results["commit"] for r in pool}),
        "device": sorted({r.results["device"] for r in recs}),
        "command": command,
    }


def copy_cost_from_twins(paths, rate_bytes_per_s=None, floor_bytes_per_s=None) -> list:
    """Pairs each ok, graph-mode, fused lookahead record that copied with a no-transfer record of the same
    configuration (commit, context, concurrency, fetch ratio, synthetic parameters; the UVA program count does not
    matter without copies), from the same file when it has one, else from another file of the same commit: the step
    time the copies cost, per 100 MB copied, and the SM share ``g`` it implies at copy rate ``rate``
    (``Δ = g · bytes / rate``); ``floor``: a rate the copy path is known to reach (the highest bytes / TPOT of the
    scored recordings), giving the copy's time at that rate and its ratio to the no-transfer step."""
    recs = []
    for p in paths:
        with open(p) as f:
            recs += [dict(json.loads(x), _src=p) for x in f if x.strip()]
    ok = [
        r
        for r in recs
        if r.get("status") == "ok"
        and r.get("cuda_graph")
        and not r.get("profile")
        and r.get("mode") == "lookahead"
        and r.get("fused_ops", True) is not False
    ]

    def key(r):
        return (
            r.get("commit"),
            r["context"],
            r["concurrency"],
            r["fetch_ratio"],
            json.dumps(r.get("synthetic_params") or {}, sort_keys=True),
        )

    out = []
    for c in (r for r in ok if not r.get("no_transfer") and r["bytes_moved_per_step"] > 0):
        twins = sorted(
            (t for t in ok if t.get("no_transfer") and key(t) == key(c)),
            key=lambda t: (t["_src"] != c["_src"], t["label"]),
        )
        if not twins:
            continue
        t = twins[0]
        d = c["tpot_ms_p50"] - t["tpot_ms_p50"]
        mb = c["bytes_moved_per_step"] / 1e6
        row = {
            "copied": c["label"],
            "twin": t["label"],
            "same_file": t["_src"] == c["_src"],
            "source": os.path.relpath(c["_src"], REPO),
            "commit": c.get("commit"),
            "context": c["context"],
            "concurrency": c["concurrency"],
            "uva_programs": c.get("uva_programs"),
            "mb_per_step": mb,
            "tpot_ms_p50": c["tpot_ms_p50"],
            "tpot_ms_p50_no_transfer": t["tpot_ms_p50"],
            "delta_ms": d,
            "delta_ms_per_100mb": 100 * d / mb,
            "copy_bound_gb_s": c["bytes_moved_per_step"] / c["tpot_ms_p50"] / 1e6,
        }
        if rate_bytes_per_s:
            row["copy_ms_at_rate"] = 1e3 * c["bytes_moved_per_step"] / rate_bytes_per_s
            row["implied_share"] = d / row["copy_ms_at_rate"]
        if floor_bytes_per_s:
            row["copy_ms_at_floor"] = 1e3 * c["bytes_moved_per_step"] / floor_bytes_per_s
            row["copy_over_no_transfer_step"] = row["copy_ms_at_floor"] / t["tpot_ms_p50"]
            row["delta_over_copy_at_floor"] = d / row["copy_ms_at_floor"]
        out.append(row)
    return sorted(
        out, key=lambda r: (r["commit"] or "", r["context"], r["concurrency"], r["uva_programs"] or 0, r["copied"])
    )


def last_step_stats(recs) -> dict:
    """How often the last timed step is the slowest (the bench's p99 over 24 steps is the slowest step), and its
    ratio to the median step; over the recordings whose sampled steps are all their timed steps."""
    import statistics

    ratios, last = [], 0
    for r in recs:
        st = [x["duration_s"] for x in r.results.get("steps") or ()]
        if not st or len(st) != r.results.get("steps_sampled_of", len(st)):
            continue
        ratios.append(st[-1] / statistics.median(st))
        last += st[-1] == max(st)
    return {
        "n": len(ratios),
        "last_is_slowest": last,
        "last_over_median": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
        if ratios
        else None,
    }


def _model_params(desc: dict, feat_gemm_ms: float, floor_gemm_ms: float) -> dict:
    """The parameters that matter, flattened: scales, offsets, the GEMM group's time per layer at the roofline's
    ``feat_gemm_ms`` with its roofline floor ``floor_gemm_ms`` (the fitted form of ``oasis_sim.fitted``:
    floor + scale · (roofline - floor) + offset), the uva gather share and copy rate."""
    excess_ms = max(feat_gemm_ms - floor_gemm_ms, 0.0)
    out = {}
    for fam in ("dense", "sparse"):
        f = desc["fits"].get(fam, {})
        g = f.get("gemm_layer", {"scale": 1.0, "offset_us": 0.0})
        out[f"{fam}_gemm_scale"] = g["scale"]
        out[f"{fam}_gemm_offset_us"] = g["offset_us"]
        out[f"{fam}_gemm_layer_ms"] = floor_gemm_ms + g["scale"] * excess_ms + g["offset_us"] / 1e3
        out[f"{fam}_attn_scale"] = f.get("attn_decode", {}).get("scale")
        if fam == "sparse":
            out["sparse_overhead_scale"] = f.get("sparse_overhead", {}).get("scale")
    out["uva_gather_sm_share"] = desc["gather_sm_share"].get("uva")
    out["uva_copy_gb_s"] = desc["h2d_gb_s"].get("uva")
    return out


def _range(vals):
    vals = [v for v in vals if v is not None]
    return [min(vals), max(vals)] if vals else None


def extended_report(recs, pool, control=None, twins=(), progress=None, set_aside=(), command=None) -> dict:
    """The report of the module docstring's "Against an earlier calibration" (JSON-ready). ``set_aside``:
    recording names also summarized apart (a second summary without them; they stay in every fit)."""
    say = progress or (lambda *_: None)
    unknown = sorted(set(set_aside) - {r.name for r in recs})
    if unknown:
        raise ValueError(f"sim_vs_exec: --set-aside: no recording named {', '.join(unknown)}")
    loo = V.validate(recs, progress=lambda n: say(f"  loo {n}"))
    old = V.validate(recs, calibrate_from=pool)
    say("  replays (roofline) for the other fits")
    samples = {recording_key(r): sample_of(r, replay(r)) for r in recs}
    lco_preds, lco_models = [], []
    for r in recs:
        k = config_key(r)
        model = V.fitted_model_for(r, [q for q in recs if config_key(q) != k], samples)
        lco_preds.append(replay(r, model.predictor_for(r)).predicted)
        lco_models.append({"left_out": sorted(q.name for q in recs if config_key(q) == k), "model": model.describe()})
        say(f"  lco {r.name}")
    m_all = fit(list(samples.values()))
    ins_preds = [replay(r, m_all.predictor_for(r)).predicted for r in recs]
    old_samples = {recording_key(r): sample_of(r, replay(r)) for r in pool}
    m_old = fit(list(old_samples.values()))
    rows = {
        "roofline": loo["predictors"]["roofline"]["recordings"],
        "fitted_loo": loo["predictors"]["fitted"]["recordings"],
        "fitted_lco": _rows(recs, lco_preds, lco_models),
        "fitted_in_sample": _rows(recs, ins_preds),
        "old_fit": old["predictors"]["fitted"]["recordings"],
    }
    for p in ("roofline", "fitted_loo", "old_fit"):  # the validate rows: add group and commit
        for r, row in zip(recs, rows[p]):
            row.update(group=group_of(r), commit=r.results["commit"])
    groups = {}
    commits = sorted({r.results["commit"] for r in recs})
    keys = sorted({group_of(r) for r in recs}) + [f"commit {c}" for c in commits]
    keys += [f"{g}, commit {c}" for g in ("dense", "lookahead") for c in commits]
    member = {
        g: {
            i
            for i, r in enumerate(recs)
            if group_of(r) == g
            or g == f"commit {r.results['commit']}"
            or g == f"{group_of(r)}, commit {r.results['commit']}"
        }
        for g in keys
    }
    for g in keys:
        sel = sorted(member[g])
        if not sel:
            continue
        groups[g] = {
            "n": len(sel),
            "recordings": [recs[i].name for i in sel],
            "predictors": {p: summarize([rows[p][i] for i in sel]) for p in EXT_PREDICTORS},
        }
    worst = {}
    for p in EXT_PREDICTORS:
        rs = sorted(rows[p], key=lambda row: -abs(row["metrics"]["tpot_ms_p50"]["err_pct"] or 0.0))
        worst[p] = [
            {
                "recording": row["recording"],
                "tpot_p50_err_pct": row["metrics"]["tpot_ms_p50"]["err_pct"],
                "throughput_err_pct": row["metrics"]["throughput_tok_s"]["err_pct"],
                "tpot_ms_p50_measured": row["metrics"]["tpot_ms_p50"]["measured"],
                "tpot_ms_p50_predicted": row["metrics"]["tpot_ms_p50"]["predicted"],
                "mb_per_step": _mb(row),
            }
            for row in rs[:6]
        ]
    feat = _median([s.feat["gemm"] * 1e3 for s in samples.values()])
    floor = _median([s.floor_of("gemm") * 1e3 for s in samples.values()])
    loo_desc = [row["model"] for row in rows["fitted_loo"]]
    models = {
        "old_all": m_old.describe(),
        "new_all": m_all.describe(),
        "gemm_feature_ms": feat,
        "gemm_floor_ms": floor,
        "params": {
            "old_all": _model_params(m_old.describe(), feat, floor),
            "new_all": _model_params(m_all.describe(), feat, floor),
        },
        "loo_range": {
            k: _range([_model_params(d, feat, floor)[k] for d in loo_desc])
            for k in (
                "uva_gather_sm_share",
                "uva_copy_gb_s",
                "sparse_overhead_scale",
                "sparse_gemm_layer_ms",
                "dense_gemm_layer_ms",
            )
        },
    }
    for d in (models["old_all"], models["new_all"]):
        d["fitted_on"] = len(d["fitted_on"])
    flags = flagged({"predictors": {p: {"recordings": rows[p]} for p in rows}}, predictors=("fitted_loo", "fitted_lco"))
    for p in EXT_PREDICTORS:  # compact rows: the compared metrics, the fold's parameters (not its training list)
        for row in rows[p]:
            row.pop("config", None)
            row["metrics"] = {k: v for k, v in row["metrics"].items() if k in KEPT_METRICS}
            if "model" in row:
                row["model"] = _model_params(row["model"], feat, floor)
    report = {
        "scheme": "roofline, leave-one-out, leave-config-out, in-sample, old fit (held-out)",
        "n_recordings": len(recs),
        "n_calibration": len(pool),
        "recordings": [r.name for r in recs],
        "calibration": [r.name for r in pool],
        "provenance": provenance(recs, pool, command),
        "predictor_names": EXT_NAMES,
        "predictors": {p: {"summary": summarize(rows[p]), "recordings": rows[p]} for p in EXT_PREDICTORS},
        "groups": groups,
        "worst_tpot_p50": worst,
        "models": models,
        "n_configs": len({config_key(r) for r in recs}),
        "flagged_over_10pct": flags,
    }
    report["last_step"] = last_step_stats(recs)
    if set_aside:
        report["set_aside"] = {
            "recordings": sorted(set_aside),
            "summary_without": {
                p: summarize([row for row in rows[p] if row["recording"] not in set(set_aside)]) for p in EXT_PREDICTORS
            },
        }
    if control:
        ctl = V.validate(control, calibrate_from=pool)
        ctl_rows = ctl["predictors"]["fitted"]["recordings"]
        for r, row in zip(control, ctl_rows):
            row.update(group=group_of(r), commit=r.results["commit"])
            row.pop("model", None)
            row.pop("config", None)
            row["metrics"] = {k: v for k, v in row["metrics"].items() if k in KEPT_METRICS}
        roof = ctl["predictors"]["roofline"]["recordings"]
        for row, rr in zip(ctl_rows, roof):
            row["roofline_tpot_err_pct"] = rr["metrics"]["tpot_ms_p50"]["err_pct"]
        report["control"] = {
            "recordings": ctl_rows,
            "old_fit_summary": summarize(ctl_rows),
            "roofline_summary": summarize(roof),
        }
    if twins:
        rate = (m_all.h2d_bytes_per_s or {}).get("uva")
        floors = [
            (r.results["bytes_per_step"].get("pcie_h2d", 0.0) / (r.results["tpot_ms_p50"] / 1e3), r.name)
            for r in recs
            if r.results["tpot_ms_p50"] > 0
        ]
        floor, floor_of = max(floors) if floors else (None, None)
        report["copy_cost_twins"] = {
            "rate_gb_s": rate / 1e9 if rate else None,
            "floor_gb_s": floor / 1e9 if floor else None,
            "floor_from": floor_of,
            "sources": [os.path.relpath(p, REPO) for p in twins],
            "pairs": copy_cost_from_twins(twins, rate, floor),
        }
    return report


def _mb(row):
    b = row["metrics"].get("pcie_h2d_bytes_per_step", {}).get("measured")
    return None if b is None else b / 1e6


def _pe(v, nd=1):
    return "-" if v is None else f"{v:+.{nd}f}"


def markdown_extended(rep: dict, recordings_rel: str, calibration_rel: str, prefix: str, causes: str = None) -> str:
    pv = rep["provenance"]
    P = EXT_PREDICTORS
    L = [
        "# Simulator vs executor: new recordings against an old calibration",
        "",
        f"{rep['n_recordings']} recordings from `{recordings_rel}/` ({rep['n_configs']} distinct simulated "
        f"configurations; records of commit{'s' if len(pv['record_commits']) > 1 else ''} "
        f"{', '.join(pv['record_commits'])}, {', '.join(pv['device'])}, {', '.join(pv['record_dates'])}). Old fit: "
        f"the fitted predictor fitted on the {rep['n_calibration']} recordings of `{calibration_rel}/` (commit"
        f"{'s' if len(pv['calibration_commits']) > 1 else ''} {', '.join(pv['calibration_commits'])}), applied "
        f"without refitting. Analysis: `experiments/simulator_vs_executor/sim_vs_exec.py` at {pv['analysis_commit']}"
        f"{' (tree with uncommitted changes)' if pv['analysis_tree_dirty'] else ''}, {pv['date']}."
        + (f" Command: `{pv['command']}`." if pv.get("command") else ""),
        "",
        "Predictors: " + "; ".join(f"**{EXT_NAMES[p]}**" for p in P) + ". Leave-config-out leaves out every "
        "recording of the scored one's simulated configuration (the same configuration at both commits, or with "
        "other UVA program counts), since leave-one-out lets those twins score each other. In-sample is the "
        "structure's training residual, not a prediction.",
        "",
        "## Error summary",
        "",
        "Absolute % error over the recordings, median / p90, and (in brackets) the signed median "
        "(+: predicted slower / higher than measured).",
        "",
        "| metric | " + " | ".join(EXT_NAMES[p] for p in P) + " |",
        "| --- |" + " --- |" * len(P),
    ]
    for k in SIGNED:
        s = V.SHORT[k]
        cells = []
        for p in P:
            sm = rep["predictors"][p]["summary"]
            med = sm[f"median_abs_err_pct_{s}"]
            cells.append(
                "-"
                if med is None
                else f"{med:.1f} / {sm[f'p90_abs_err_pct_{s}']:.1f} ({_pe(sm[f'median_signed_err_pct_{s}'])})"
            )
        L.append(f"| {s} | " + " | ".join(cells) + " |")
    ls = rep.get("last_step")
    if ls and ls["n"]:
        lo = ls["last_over_median"]
        L += [
            "",
            f"TPOT p99: the last timed step is the slowest in {ls['last_is_slowest']} of {ls['n']} recordings "
            f"({lo['min']:.2f}–{lo['max']:.2f}×, median {lo['median']:.2f}× the median step), so the bench's p99 "
            "(nearest rank over 24 steps) is that step.",
        ]
    sa = rep.get("set_aside")
    if sa:
        L += [
            "",
            f"Without the {len(sa['recordings'])} set-aside recordings ({', '.join(sa['recordings'])}; scored "
            "apart, still in every fit), TPOT p50 / throughput:",
            "",
            "| metric | " + " | ".join(EXT_NAMES[p] for p in P) + " |",
            "| --- |" + " --- |" * len(P),
        ]
        for k in ("tpot_ms_p50", "throughput_tok_s"):
            sh = V.SHORT[k]
            cells = [
                f"{sa['summary_without'][p][f'median_abs_err_pct_{sh}']:.1f} / "
                f"{sa['summary_without'][p][f'p90_abs_err_pct_{sh}']:.1f} "
                f"({_pe(sa['summary_without'][p][f'median_signed_err_pct_{sh}'])})"
                for p in P
            ]
            L.append(f"| {sh} | " + " | ".join(cells) + " |")
    L += [
        "",
        "## By group (TPOT p50: median |error| % (signed median))",
        "",
        "| group | n | " + " | ".join(EXT_NAMES[p] for p in P) + " |",
        "| --- | --- |" + " --- |" * len(P),
    ]
    for g, d in rep["groups"].items():
        cells = []
        for p in P:
            sm = d["predictors"][p]
            cells.append(f"{_f(sm['median_abs_err_pct_tpot_p50'])} ({_pe(sm['median_signed_err_pct_tpot_p50'])})")
        L.append(f"| {g} | {d['n']} | " + " | ".join(cells) + " |")
    L += [
        "",
        "## Worst configurations (TPOT p50)",
        "",
        "| predictor | recording | MB/step | measured ms | predicted ms | TPOT err % | throughput err % |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in ("fitted_loo", "fitted_lco", "old_fit", "roofline"):
        for w in rep["worst_tpot_p50"][p][:5]:
            L.append(
                f"| {EXT_NAMES[p]} | {w['recording']} | {_f(w['mb_per_step'], 0)} | "
                f"{_f(w['tpot_ms_p50_measured'], 2)} | "
                f"{_f(w['tpot_ms_p50_predicted'], 2)} | {_pe(w['tpot_p50_err_pct'])} | "
                f"{_pe(w['throughput_err_pct'])} |"
            )
    m = rep["models"]
    po, pn = m["params"]["old_all"], m["params"]["new_all"]
    lr = m["loo_range"]
    L += [
        "",
        "## The two fits",
        "",
        f"Fitted on all {m['old_all']['fitted_on']} old recordings vs on all {m['new_all']['fitted_on']} new ones "
        f"(GEMM group per layer: at the roofline's median GEMM + norm time of {m['gemm_feature_ms']:.4f} ms, "
        f"floor {m.get('gemm_floor_ms') or 0.0:.4f} ms; "
        "range: over the leave-one-out folds on the new set).",
        "",
        "| parameter | old fit | refit on the new set | leave-one-out range |",
        "| --- | --- | --- | --- |",
    ]
    rows = [
        ("dense: GEMM + norm per layer, ms", "dense_gemm_layer_ms", 4),
        ("dense: GEMM scale / offset µs", None, None),
        ("dense: attention scale", "dense_attn_scale", 3),
        ("sparse: GEMM + norm per layer, ms", "sparse_gemm_layer_ms", 4),
        ("sparse: GEMM scale / offset µs", None, None),
        ("sparse: attention scale", "sparse_attn_scale", 3),
        ("sparse: per-request overhead scale", "sparse_overhead_scale", 3),
        ("uva: gather SM share", "uva_gather_sm_share", 3),
        ("uva: copy rate, GB/s", "uva_copy_gb_s", 1),
    ]
    for name, k, nd in rows:
        if k is None:
            fam = name.split(":")[0]
            L.append(
                f"| {name} | {po[f'{fam}_gemm_scale']:.3f} / {po[f'{fam}_gemm_offset_us']:.1f} | "
                f"{pn[f'{fam}_gemm_scale']:.3f} / {pn[f'{fam}_gemm_offset_us']:.1f} | |"
            )
            continue
        r = lr.get(k)
        L.append(
            f"| {name} | {_f(po[k], nd)} | {_f(pn[k], nd)} | {'' if not r else f'{r[0]:.{nd}f} – {r[1]:.{nd}f}'} |"
        )
    L += [
        "",
        f"Fit objectives (mean squared relative TPOT error of the sparse-family rows + prior): old "
        f"{m['old_all']['gather_fit'].get('uva', {}).get('objective')}, new "
        f"{m['new_all']['gather_fit'].get('uva', {}).get('objective')}.",
    ]
    tw = rep.get("copy_cost_twins")
    if tw:
        L += [
            "",
            "## What the copies cost: no-transfer twins",
            "",
            f"Each no-transfer record (selections planned, copies skipped; not replayable) beside the record of "
            f"the same configuration that copied ({', '.join(f'`{s}`' for s in tw['sources'])}). Implied share: "
            f"the step time added by the copies over the copy's own time at the refit's rate "
            f"({_f(tw['rate_gb_s'], 1)} GB/s); bytes / TPOT: a floor on the copy rate. Copy / step: the copy's "
            f"time at the highest bytes / TPOT of the scored recordings ({_f(tw['floor_gb_s'], 1)} GB/s, "
            f"{tw['floor_from']}) over the no-transfer step; Δ / copy: the share of that copy time the step "
            "grew by.",
            "",
            "| copied | no-transfer twin | commit | ctx | n | UVA programs | MB/step | TPOT ms | no-transfer ms | "
            "Δ ms | Δ ms / 100 MB | implied share | bytes / TPOT GB/s | copy / step | Δ / copy |",
            "| --- |" + " --- |" * 14,
        ]
        for t in tw["pairs"]:
            twin = t["twin"] + ("" if t["same_file"] else " (other file)")
            L.append(
                f"| {t['copied']} | {twin} | {t['commit']} | {t['context'] // 1024}K | {t['concurrency']} | "
                f"{t['uva_programs']} | {t['mb_per_step']:.0f} | {t['tpot_ms_p50']:.2f} | "
                f"{t['tpot_ms_p50_no_transfer']:.2f} | {t['delta_ms']:+.2f} | {_f(t['delta_ms_per_100mb'], 2)} | "
                f"{_f(t.get('implied_share'), 2)} | {t['copy_bound_gb_s']:.1f} | "
                f"{_f(t.get('copy_over_no_transfer_step'), 2)} | {_f(t.get('delta_over_copy_at_floor'), 2)} |"
            )
    ctl = rep.get("control")
    if ctl:
        L += [
            "",
            "## Control: the old fit on the fused-off twins",
            "",
            "The same executor commits with `fused_ops` off (plain torch norms/RoPE/SwiGLU and selection), scored "
            "by the old fit: if the fused kernels are what made the old calibration stale, it should still fit "
            "these.",
            "",
            "| recording | measured TPOT ms | old fit ms | err % | roofline err % |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in ctl["recordings"]:
            mt = row["metrics"]["tpot_ms_p50"]
            L.append(
                f"| {row['recording']} | {_f(mt['measured'], 2)} | {_f(mt['predicted'], 2)} | "
                f"{_pe(mt['err_pct'])} | {_pe(row['roofline_tpot_err_pct'])} |"
            )
        sm = ctl["old_fit_summary"]
        L += [
            "",
            f"Old fit on the {len(ctl['recordings'])} fused-off twins: TPOT p50 median |error| "
            f"{_f(sm['median_abs_err_pct_tpot_p50'])}% (signed {_pe(sm['median_signed_err_pct_tpot_p50'])}%).",
        ]
    L += [
        "",
        "## Per recording (TPOT p50 and throughput errors, %)",
        "",
        "| recording | group | MB/step | TPOT ms | "
        + " | ".join(EXT_NAMES[p] for p in P)
        + " | tok/s | "
        + " | ".join(EXT_NAMES[p] for p in P)
        + " |",
        "| --- | --- | --- | --- |" + " --- |" * (2 * len(P) + 1),
    ]
    for i, name in enumerate(rep["recordings"]):
        r0 = rep["predictors"]["roofline"]["recordings"][i]
        cells = [name, r0["group"], _f(_mb(r0), 0), _f(r0["metrics"]["tpot_ms_p50"]["measured"], 2)]
        cells += [_pe(rep["predictors"][p]["recordings"][i]["metrics"]["tpot_ms_p50"]["err_pct"]) for p in P]
        cells.append(_f(r0["metrics"]["throughput_tok_s"]["measured"], 0))
        cells += [_pe(rep["predictors"][p]["recordings"][i]["metrics"]["throughput_tok_s"]["err_pct"]) for p in P]
        L.append("| " + " | ".join(cells) + " |")
    if causes and os.path.exists(causes):
        with open(causes) as f:
            L += ["", f.read().rstrip()]
    L += ["", f"![predicted vs measured]({prefix}.png)", ""]
    return "\n".join(L)


def _json_ready(obj):
    return json.loads(json.dumps(obj))


def run(
    recordings_dir: str,
    out_dir: str,
    out_prefix: str = "sim_vs_exec",
    calibrate_from: str = None,
    control: str = None,
    twins=(),
    causes: str = None,
    set_aside=(),
    command: str = None,
) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    md_path, js_path, png_path = (os.path.join(out_dir, f"{out_prefix}.{e}") for e in ("md", "json", "png"))
    files = find_recordings(recordings_dir)
    if not files:
        msg = (
            f"No executor recordings in `{os.path.relpath(recordings_dir, REPO)}` yet: nothing to compare. "
            "Record them on the H200 with `python experiments/simulator_vs_executor/record_matrix.py --out traces/recordings` and run "
            "this script again."
        )
        with open(md_path, "w") as f:
            f.write(f"# Simulator vs executor\n\n{msg}\n")
        report = {"n_recordings": 0, "note": msg}
        with open(js_path, "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")
        if os.path.exists(png_path):
            os.remove(png_path)
        print(msg)
        return report
    recs = V.load_all(files)
    rel = os.path.relpath(os.path.abspath(recordings_dir), REPO)
    if calibrate_from:
        pool = V.load_all([calibrate_from])
        if not pool:
            raise SystemExit(f"sim_vs_exec: no recordings in --calibrate-from {calibrate_from}")
        ctl = V.load_all([control]) if control else None
        report = extended_report(
            recs,
            pool,
            ctl,
            tuple(twins or ()),
            progress=lambda m: print(m, file=sys.stderr),
            set_aside=tuple(set_aside or ()),
            command=command,
        )
        report = _json_ready(report)
        with open(js_path, "w") as f:
            f.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
        with open(md_path, "w") as f:
            f.write(
                markdown_extended(
                    report, rel, os.path.relpath(os.path.abspath(calibrate_from), REPO), out_prefix, causes
                )
            )
        plot(
            report,
            png_path,
            predictors=("roofline", "fitted_loo", "old_fit"),
            suptitle="OasisKV simulator vs H200 recordings: roofline, refit (leave-one-out), old fit",
        )
        for p in EXT_PREDICTORS:
            sm = report["predictors"][p]["summary"]
            print(
                f"{EXT_NAMES[p]:>40}: TPOT p50 {sm['median_abs_err_pct_tpot_p50']:.1f} / "
                f"{sm['p90_abs_err_pct_tpot_p50']:.1f} (signed {sm['median_signed_err_pct_tpot_p50']:+.1f}), "
                f"throughput {sm['median_abs_err_pct_throughput']:.1f} / {sm['p90_abs_err_pct_throughput']:.1f}"
            )
        print(f"wrote {md_path}, {js_path}, {png_path}")
        return report
    report = V.validate(recs, progress=lambda name: print(f"  scored {name}", file=sys.stderr))
    flags = flagged(report)
    report["flagged_over_10pct"] = flags
    with open(js_path, "w") as f:
        f.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    with open(md_path, "w") as f:
        f.write(markdown(report, flags, rel, out_prefix, causes))
    plot(report, png_path)
    print(V.report_table(report))
    print(f"wrote {md_path}, {js_path}, {png_path}")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recordings", default=os.path.join(REPO, "traces", "recordings"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--out-prefix", default="sim_vs_exec", help="output names: PREFIX.md, .json, .png")
    ap.add_argument(
        "--calibrate-from",
        default=None,
        metavar="DIR",
        help="recordings of an earlier calibration: adds the old fit (not refitted), leave-config-out, "
        "in-sample, groups and both fits' parameters (module docstring)",
    )
    ap.add_argument(
        "--control",
        default=None,
        metavar="DIR",
        help="with --calibrate-from: recordings scored by the old fit alone (e.g. fused-off twins)",
    )
    ap.add_argument(
        "--twins",
        nargs="*",
        default=(),
        metavar="JSONL",
        help="with --calibrate-from: bench records with no-transfer twins (copy cost table)",
    )
    ap.add_argument(
        "--set-aside",
        nargs="*",
        default=(),
        metavar="RECORDING",
        help="with --calibrate-from: recording names also summarized apart (a second summary without "
        "them; they stay in every fit)",
    )
    ap.add_argument(
        "--causes",
        default=None,
        metavar="FILE",
        help="hand-written causes section to include (default experiments/simulator_vs_executor/sim_vs_exec_causes.md without "
        "--calibrate-from, none with it)",
    )
    a = ap.parse_args(argv)
    if (a.control or a.twins or a.set_aside) and not a.calibrate_from:
        ap.error("--control, --twins and --set-aside need --calibrate-from")
    args = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(
        ["python experiments/simulator_vs_executor/sim_vs_exec.py"]
        + [os.path.relpath(x, REPO) if os.path.isabs(x) and x.startswith(REPO) else x for x in args]
    )
    run(a.recordings, a.out, a.out_prefix, a.calibrate_from, a.control, a.twins, a.causes, a.set_aside, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
