"""Score the simulator against executor recordings: measured vs predicted, per recording and in aggregate.

``validate(recordings, calibrate_from=None) -> dict`` replays every recording twice:

- ``roofline``: the analytic ``RooflinePredictor`` alone (no calibration);
- ``fitted``: a ``FittedPredictor`` (``oasis_sim.fitted``) fitted **without the scored recording**. Scheme
  ``leave-one-out`` (no ``calibrate_from``): fitted on all the other scored recordings. Scheme ``held-out``
  (``calibrate_from`` given): fitted on the calibration set minus the scored recording if it is also there. Each
  row records the recordings its model was fitted on; a model whose ``fitted_on`` holds the scored recording's
  content key is refused (``LeakError``), so the rule holds by construction, not by convention.

Errors: ``err_pct = 100 · (predicted - measured) / measured`` (None when not measured, or measured is 0). The
aggregate per predictor and metric is the median and p90 (numpy linear interpolation) of ``|err_pct|`` over the
recordings; the report's top level repeats the fitted predictor's figures under the names
``median_abs_err_pct_<metric>`` / ``p90_abs_err_pct_<metric>`` (``tpot_p50``, ``tpot_p99``, ``throughput``,
``ttft_p50``, ``h2d_bytes``, ``stall``, ``layer_<stage>``), and the roofline's with a ``roofline_`` prefix.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

import numpy as np

from oasis_core.recording import Recording, find_recordings, load_recording

from .fitted import FittedModel, fit, recording_key, sample_of
from .replay import METRICS, measured_metrics, replay

SHORT = {
    "tpot_ms_p50": "tpot_p50",
    "tpot_ms_p99": "tpot_p99",
    "throughput_tok_s": "throughput",
    "ttft_ms_p50": "ttft_p50",
    "pcie_h2d_bytes_per_step": "h2d_bytes",
    "stall_ms_per_step": "stall",
    "layer_ms_layers": "layer_layers",
    "layer_ms_gemm": "layer_gemm",
    "layer_ms_attn": "layer_attn",
    "layer_ms_pred": "layer_pred",
    "layer_ms_select": "layer_select",
    "layer_ms_transfer": "layer_transfer",
}
PREDICTORS = ("roofline", "fitted")


class LeakError(RuntimeError):
    """A fitted model would be scored on a recording it was fitted on."""


def load_all(paths: Sequence[str]) -> list:
    """Recordings from files and directories (a directory: every ``*.json`` under it, sorted)."""
    out = []
    for p in paths:
        files = find_recordings(p) if os.path.isdir(p) else [p]
        out += [load_recording(f) for f in files]
    return out


def err_pct(measured, predicted) -> Optional[float]:
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _row(rec: Recording, predicted: dict) -> dict:
    meas = measured_metrics(rec)
    return {
        k: {"measured": meas[k], "predicted": predicted.get(k), "err_pct": err_pct(meas[k], predicted.get(k))}
        for k in METRICS
        if meas[k] is not None or predicted.get(k) is not None
    }


def fitted_model_for(scored: Recording, pool: Sequence[Recording], samples: dict) -> FittedModel:
    """The fitted model used to score ``scored``: fitted on ``pool`` minus ``scored`` (by content)."""
    key = recording_key(scored)
    model = fit([samples[recording_key(r)] for r in pool if recording_key(r) != key])
    if key in model.fitted_on:
        raise LeakError(f"{scored.name}: the fitted model was fitted on the recording it would be scored on")
    return model


def _aggregate(rows: list) -> dict:
    out = {}
    for k in METRICS:
        errs = [
            abs(r["metrics"][k]["err_pct"])
            for r in rows
            if k in r["metrics"] and r["metrics"][k]["err_pct"] is not None
        ]
        s = SHORT[k]
        out[f"n_{s}"] = len(errs)
        out[f"median_abs_err_pct_{s}"] = float(np.median(errs)) if errs else None
        out[f"p90_abs_err_pct_{s}"] = float(np.percentile(errs, 90)) if errs else None
    return out


def validate(
    recordings: Sequence[Recording], calibrate_from: Optional[Sequence[Recording]] = None, progress=None
) -> dict:
    """The validation report (a JSON-ready dict); see the module docstring."""
    if not recordings:
        raise ValueError("validate: no recordings to score")
    scheme = "leave-one-out" if calibrate_from is None else "held-out"
    pool = list(recordings if calibrate_from is None else calibrate_from)
    roof = {}
    samples = {}
    for rec in list(recordings) + pool:
        k = recording_key(rec)
        if k not in roof:
            res = replay(rec)
            roof[k] = res
            samples[k] = sample_of(rec, res)
    rows = {p: [] for p in PREDICTORS}
    for rec in recordings:
        k = recording_key(rec)
        rows["roofline"].append({"recording": rec.name, "config": rec.config, "metrics": _row(rec, roof[k].predicted)})
        model = fitted_model_for(rec, pool, samples)
        if model.fitted_on:
            pred = replay(rec, model.predictor_for(rec)).predicted
        else:  # nothing to calibrate from: the fitted predictor is the roofline
            pred = roof[k].predicted
        rows["fitted"].append(
            {"recording": rec.name, "config": rec.config, "metrics": _row(rec, pred), "model": model.describe()}
        )
        if progress:
            progress(rec.name)
    report = {
        "scheme": scheme,
        "n_recordings": len(recordings),
        "n_calibration": len(pool),
        "recordings": [r.name for r in recordings],
        "calibration": [r.name for r in pool],
        "note": (
            "fitted: leave-one-out, each recording scored by a model fitted on all the others"
            if scheme == "leave-one-out"
            else "fitted: held-out, each recording scored by a model fitted on the --calibrate-from set "
            "minus that recording"
        ),
        "predictors": {p: {"summary": _aggregate(rows[p]), "recordings": rows[p]} for p in PREDICTORS},
    }
    for k, v in report["predictors"]["fitted"]["summary"].items():
        report[k] = v
    for k, v in report["predictors"]["roofline"]["summary"].items():
        report[f"roofline_{k}"] = v
    return report


# ----------------------------------------------------------------------------------------------------------------
# Printing


def _fmt(v) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e6:
        return f"{v:.4g}"
    if a >= 100:
        return f"{v:,.1f}"
    return f"{v:.4g}"


def _e(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def report_table(report: dict) -> str:
    lines = [f"validation: {report['n_recordings']} recordings, fitted predictor {report['note']}"]
    roof, fitd = (report["predictors"][p]["recordings"] for p in PREDICTORS)
    for r0, r1 in zip(roof, fitd):
        lines.append("")
        lines.append(r0["recording"])
        rows = [("metric", "measured", "roofline", "err", "fitted", "err")]
        for k, m in r0["metrics"].items():
            f = r1["metrics"].get(k, {})
            rows.append(
                (
                    k,
                    _fmt(m["measured"]),
                    _fmt(m["predicted"]),
                    _e(m["err_pct"]),
                    _fmt(f.get("predicted")),
                    _e(f.get("err_pct")),
                )
            )
        w = [max(len(x[i]) for x in rows) for i in range(6)]
        lines += ["  " + "  ".join(x[i].ljust(w[i]) if i == 0 else x[i].rjust(w[i]) for i in range(6)) for x in rows]
    lines.append("")
    lines.append("absolute % error over recordings: median / p90 (n)")
    rows = [("metric", "roofline", "fitted")]
    for k in METRICS:
        s = SHORT[k]
        cells = []
        for p in PREDICTORS:
            sm = report["predictors"][p]["summary"]
            med, p90, n = sm[f"median_abs_err_pct_{s}"], sm[f"p90_abs_err_pct_{s}"], sm[f"n_{s}"]
            cells.append("-" if med is None else f"{med:.1f} / {p90:.1f} ({n})")
        if cells != ["-", "-"]:
            rows.append((s, *cells))
    w = [max(len(x[i]) for x in rows) for i in range(3)]
    lines += ["  " + "  ".join(x[i].ljust(w[i]) if i == 0 else x[i].rjust(w[i]) for i in range(3)) for x in rows]
    return "\n".join(lines)


def write_report(report: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "validate.json")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return path


# ----------------------------------------------------------------------------------------------------------------
# CLI: ``python -m oasis_sim replay|validate`` (registered by oasis_sim.cli)


def add_subcommands(sub) -> None:
    rp = sub.add_parser("replay", help="simulate an executor recording with its own configuration")
    rp.add_argument("recording", help="recording file (oasis_core.recording)")
    rp.add_argument("--out", default="out/replay", help="output directory")
    rp.add_argument(
        "--calibrate-from",
        nargs="+",
        default=None,
        metavar="RECORDING",
        help="use a predictor fitted on these recordings (files or directories; the replayed "
        "recording itself is left out)",
    )
    rp.add_argument("--no-selection", action="store_true", help="ignore the recorded block sets; synthetic ones")
    va = sub.add_parser("validate", help="measured vs predicted over recordings (roofline and fitted predictor)")
    va.add_argument("recordings", nargs="+", metavar="RECORDING", help="recording files or directories")
    va.add_argument(
        "--calibrate-from",
        nargs="+",
        default=None,
        metavar="RECORDING",
        help="fit on these (held-out scheme) instead of leave-one-out over the scored recordings",
    )
    va.add_argument("--out", default="out/validate", help="output directory (validate.json)")
    va.add_argument("--quiet", action="store_true", help="no table")
    va.add_argument(
        "--predictor",
        choices=("both", "calibrated", "roofline"),
        default="both",
        help="bench points (.jsonl, oasis_sim.validate_bench): the predictors scored",
    )
    va.add_argument("--calibration", default=None, help="bench points: calibration file (default: the shipped one)")


def _one_line_errors(fn):
    def run(args):
        from oasis_core.trace import TraceError

        from .config import ConfigError

        try:
            return fn(args)
        except (TraceError, ConfigError):
            raise
        except (ValueError, RuntimeError) as e:
            raise ConfigError(" ".join(str(e).split())) from None

    return run


@_one_line_errors
def cmd_replay(args) -> int:
    from .files import prepare_out_dir
    from .replay import replay_table, write_replay

    prepare_out_dir(args.out)
    rec = load_recording(args.recording)
    predictor = None
    if args.calibrate_from:
        pool = load_all(args.calibrate_from)
        samples = {recording_key(r): sample_of(r, replay(r)) for r in pool}
        model = fitted_model_for(rec, pool, samples)
        predictor = model.predictor_for(rec) if model.fitted_on else None
    res = replay(rec, predictor, work_dir=args.out, use_selection=not args.no_selection)
    note = predictor.clamp_note() if predictor is not None else None
    if note:
        print(f"oasis-sim: warning: {note}", file=sys.stderr)
    names = write_replay(res, args.out)
    print(f"replay of {rec.name} ({'fitted' if predictor else 'roofline'} predictor, {len(res.window)} timed steps)")
    print(replay_table(res))
    print(f"wrote {args.out}/{', '.join(sorted(names))}")
    return 0


@_one_line_errors
def cmd_validate(args) -> int:
    from .files import prepare_out_dir
    from .validate_bench import cmd_validate_points, is_points

    if is_points(args.recordings):  # bench points (traces/bench_points): the simulator as `oasis_sim bench` runs
        return cmd_validate_points(args)

    prepare_out_dir(args.out)
    recs = load_all(args.recordings)
    if not recs:
        raise ValueError(f"validate: no recordings found in {' '.join(args.recordings)}")
    pool = load_all(args.calibrate_from) if args.calibrate_from else None
    report = validate(recs, pool)
    path = write_report(report, args.out)
    if not args.quiet:
        print(report_table(report))
    print(f"wrote {path}")
    return 0
