"""``python -m oasis_sim validate POINTS...`` on bench points: the simulator as a user runs it, against the GPU.

Each held-out point (``traces/bench_points/heldout``) is simulated as ``oasis_sim bench`` would (``bench.run_point``:
the decode-only closed loop, the executor's lanes, the synthetic selection) with each predictor -- ``calibrated``
(the shipped file, or ``--calibration``) and ``roofline`` -- and scored: ``err_pct = 100 · (predicted - measured) /
measured`` for TPOT, tok/s and bytes a step (where measured), then the median and worst ``|err_pct|`` per
predictor and metric, overall and per model. Pairs of an OasisKV point and a vLLM point of the same model, context,
date and commit give the OasisKV / vLLM ratio, measured and predicted.

A point the calibration was fitted on (its content key in the file's ``fit.fitted_points``) is refused: the fit
never sees what it is scored on.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .bench import load_points, run_point
from .calibrate import point_key
from .calibrated import load_calibration


class LeakError(RuntimeError):
    """A point the calibration was fitted on was given to be scored."""


def _err(measured, predicted):
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _agg(vals):
    v = [abs(x) for x in vals if x is not None]
    if not v:
        return None
    worst = max(vals, key=lambda x: abs(x) if x is not None else -1)
    return {"n": len(v), "median_abs": round(float(np.median(v)), 2), "worst": round(float(worst), 2)}


def validate_points(points, predictors=("calibrated", "roofline"), calibration=None) -> dict:
    cal = load_calibration(calibration)
    fitted = set(cal.fit.get("fitted_points", ()))
    leaks = [p.name for p in points if point_key(p) in fitted]
    if leaks:
        raise LeakError(f"validate: {len(leaks)} point(s) were fitted on: {', '.join(leaks[:3])}")
    rows = []
    for p in points:
        row = {"point": p.name, "source": p.source, "weights": p.weights, "selection": p.selection}
        meas_tpot = p.measured_tpot_s()
        meas_tok = p.tok_s if p.tok_s else (p.lanes / meas_tpot if meas_tpot else None)
        row["measured"] = {
            "tpot_ms": round(meas_tpot * 1e3, 4) if meas_tpot else None,
            "tok_s": meas_tok,
            "bytes_per_step": p.bytes_per_step,
        }
        for name in predictors:
            over = {"predictor": name}
            if name == "calibrated" and calibration:
                over["calibration"] = calibration
            r = run_point(p, **over)
            row[name] = {
                "tpot_ms": round(r.tpot_s * 1e3, 4),
                "tok_s": round(r.tok_s, 2),
                "bytes_per_step": round(r.bytes_per_step),
                "lanes": r.lanes,
                "err_pct": {
                    "tpot": _err(meas_tpot, r.tpot_s),
                    "tok_s": _err(meas_tok, r.tok_s),
                    "bytes_per_step": _err(p.bytes_per_step, r.bytes_per_step) if p.bytes_per_step else None,
                },
            }
        rows.append((p, row))
    summary = {}
    for name in predictors:
        s = {}
        for metric in ("tpot", "tok_s", "bytes_per_step"):
            s[metric] = _agg([row[name]["err_pct"][metric] for _p, row in rows])
            for model in sorted({p.model for p, _r in rows}):
                s[f"{metric}:{model}"] = _agg([row[name]["err_pct"][metric] for p, row in rows if p.model == model])
        summary[name] = s
    ratios = []
    for p, row in rows:
        if p.engine != "oasis" or p.no_transfer:  # a no-transfer twin is not a throughput OasisKV serves at
            continue
        base = [
            (q, r)
            for q, r in rows
            if q.engine == "vllm" and q.model == p.model and q.context == p.context and q.commit == p.commit
        ]
        for q, r in base:
            m = row["measured"]["tok_s"] / r["measured"]["tok_s"] if row["measured"]["tok_s"] else None
            entry = {"oasis": p.name, "vllm": q.name, "measured": round(m, 4) if m else None}
            for name in predictors:
                pr = row[name]["tok_s"] / r[name]["tok_s"]
                entry[name] = {"ratio": round(pr, 4), "err_pct": _err(m, pr)}
            ratios.append(entry)
    for name in predictors:
        summary[name]["ratio"] = _agg([e[name]["err_pct"] for e in ratios])
    return {
        "calibration": {
            "describe": cal.describe(),
            "fitted_on": list(cal.fitted_on),
            "date": cal.date,
            "commit": cal.commit,
        },
        "points": [row for _p, row in rows],
        "ratios": ratios,
        "summary": summary,
    }


def report_table(rep: dict, predictors=("calibrated", "roofline")) -> str:
    lines = [rep["calibration"]["describe"], ""]
    head = "point".ljust(58) + "measured TPOT  " + "  ".join(f"{n[:10]:>10} err%" for n in predictors)
    lines.append(head)
    for row in rep["points"]:
        m = row["measured"]["tpot_ms"]
        cells = []
        for n in predictors:
            e = row[n]["err_pct"]["tpot"]
            cells.append(
                f"{row[n]['tpot_ms']:>10.2f} {e:+5.1f}" if e is not None else f"{row[n]['tpot_ms']:>10.2f}   -"
            )
        lines.append(f"{row['point'][:57]:<58}{m if m is None else round(m, 2)!s:>13}  " + "  ".join(cells))
    lines.append("")
    for e in rep["ratios"]:
        cells = "  ".join(f"{n} {e[n]['ratio']:.2f} ({e[n]['err_pct']:+.1f}%)" for n in predictors)
        lines.append(f"ratio {e['oasis']} / {e['vllm']}: measured {e['measured']:.2f}; {cells}")
    lines.append("")
    for n in predictors:
        s = rep["summary"][n]
        parts = []
        for metric in ("tpot", "tok_s", "bytes_per_step", "ratio"):
            a = s.get(metric)
            if a:
                parts.append(f"{metric} median |err| {a['median_abs']}% worst {a['worst']:+}% (n={a['n']})")
        lines.append(f"{n}: " + "; ".join(parts))
    return "\n".join(lines)


def is_points(paths) -> bool:
    """Whether ``paths`` name bench points (``.jsonl`` files, or folders holding them and no recordings)."""
    for p in paths:
        if os.path.isdir(p):
            has = any(f.endswith(".jsonl") for _dp, _d, fs in os.walk(p) for f in fs)
            rec = any(f.endswith(".json") for _dp, _d, fs in os.walk(p) for f in fs)
            if not has or rec:
                return False
        elif not p.endswith(".jsonl"):
            return False
    return True


def cmd_validate_points(args) -> int:
    from .files import prepare_out_dir

    prepare_out_dir(args.out)
    points, _files = load_points(args.recordings)
    preds = ("calibrated", "roofline") if args.predictor == "both" else (args.predictor,)
    rep = validate_points(points, preds, args.calibration)
    path = os.path.join(args.out, "validate_bench.json")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(rep, indent=1, sort_keys=True) + "\n")
    if not args.quiet:
        print(report_table(rep, preds))
    print(f"wrote {path}")
    return 0
