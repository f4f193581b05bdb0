"""Run results: the summary dict (``summary.json``), one row per request (``requests.csv``), per-step log
(``steps.csv``) and memory occupancy series (``memory.csv``).

Definitions: TTFT = first output token time − arrival; TPOT = (finish − first token) / (output − 1) per request
with output > 1; every request ends completed or rejected (``requests_rejected``, and by reason
``rejected_context_limit`` / ``rejected_gpu_capacity`` / ``rejected_host_capacity``); request figures are over the
completed ones; percentiles are numpy's linear interpolation over requests. ``throughput_tok_s`` = output tokens
of completed requests / ``simulated_s``; ``simulated_s`` = last completion − first arrival. ``resident_recall`` =
mean over (request, decode step) of the share of the true top-K resident when the layer attends (1 for dense and
quest). ``stall_ms_total`` = compute-stream time spent waiting for transfers (layer-local sync, summed over steps).
Every value is a plain float/int rounded to fixed digits, so equal runs give byte-identical files. Wall-clock
time is *not* here (it would break that): see ``timing.json``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import operator

import numpy as np

REQUEST_COLUMNS = (
    "id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "admit_s",
    "first_token_s",
    "finish_s",
    "ttft_ms",
    "tpot_ms",
    "preemptions",
    "prefix_hit_tokens",
    "fetched_slices",
    "h2d_bytes",
    "net_bytes",
    "stall_ms",
    "resident_recall",
)


def _r(x, nd=6):
    return None if x is None else round(float(x), nd)


def _pct(values, q):
    return _r(np.percentile(values, q), 4) if len(values) else None


def round_list(x, nd: int) -> list:
    """``[round(float(v), nd) for v in x]`` for an array of floats, the same floats (``round`` is correctly rounded:
    the nearest float to the decimal rounding of the exact value), at numpy's speed: ``rint(x · 10^nd) / 10^nd`` is
    that float wherever ``x · 10^nd`` (rounded once) is more than an ulp from a half-integer (an exact integer
    divided by the exact ``10^nd``: one correct rounding); ``round`` itself for the others (ties, near-ties,
    non-finite or huge values)."""
    x = np.asarray(x, dtype=np.float64)
    scale = 10.0**nd
    p = x * scale
    with np.errstate(invalid="ignore"):
        a = np.abs(p)
        exact = (a < 2.0**52) & (np.abs(p - (np.floor(p) + 0.5)) > np.spacing(a))
    out = (np.rint(p) / scale).tolist()
    if not exact.all():
        for i in np.flatnonzero(~exact).tolist():
            out[i] = round(float(x[i]), nd)
    return out


_REQ_FIELDS = (
    "id",
    "arrival",
    "prompt_len",
    "max_tokens",
    "admit_t",
    "first_token_t",
    "finish_t",
    "preempted",
    "prefix_hit_tokens",
    "fetch_blocks",
    "net_bytes",
    "stall_s",
    "recall_sum",
    "recall_n",
)


def _round_opt(values, nd: int) -> list:
    """``_r(v, nd)`` for each of ``values`` (None stays None)."""
    if None not in values:
        return round_list(values, nd)
    out = round_list([np.nan if v is None else v for v in values], nd)
    return [None if v is None else o for v, o in zip(values, out)]


def request_rows(done, bpbh: float) -> list[dict]:
    """One row (``REQUEST_COLUMNS``) per completed request, by id; each figure rounded as ``_r`` does, a column at
    a time (``round_list``)."""
    if not done:
        return []
    done = sorted(done, key=operator.attrgetter("id"))

    (ids, arrival, prompt, output, admit, first, finish, preempt, hit, fetch, net, stall, rsum, rn) = (
        list(map(operator.attrgetter(name), done))
        for name in _REQ_FIELDS  # (a list a field: no tuple a request)
    )
    f64 = np.float64
    arr, fst, fin = np.array(arrival, f64), np.array(first, f64), np.array(finish, f64)
    out = np.array(output, f64)
    multi = out > 1
    tpot = round_list((fin - fst) / np.where(multi, out - 1, 1.0) * 1e3, 4)
    rn_a, fetch_a = np.array(rn, f64), np.array(fetch, f64)
    recall = np.where(rn_a != 0, np.array(rsum, f64) / np.where(rn_a != 0, rn_a, 1.0), 1.0)
    cols = (
        ids,
        round_list(arr, 6),
        prompt,
        output,
        _round_opt(admit, 6),
        _round_opt(first, 6),
        round_list(fin, 6),
        round_list((fst - arr) * 1e3, 4),
        [t if m else None for t, m in zip(tpot, multi.tolist())],
        preempt,
        hit,
        round_list(fetch_a, 2),
        round_list(fetch_a * bpbh, 0),
        round_list(np.array(net, f64), 0),
        round_list(np.array(stall, f64) * 1e3, 4),
        round_list(recall, 6),
    )
    return [dict(zip(REQUEST_COLUMNS, row)) for row in zip(*cols)]


def summarize(
    cfg,
    rows,
    *,
    n_requests,
    preemptions,
    h2d_bytes,
    d2h_bytes,
    net_bytes,
    hbm_peak,
    host_peak,
    recall_sum,
    recall_n,
    stall_s,
    steps,
    end_s,
    first_arrival_s,
    rejections=None,
    extra=None,
) -> dict:
    """``rejections``: reason -> requests rejected (``oasis_core.scheduler.REJECT_REASONS``)."""
    from oasis_core.scheduler import REJECT_REASONS

    rejections = rejections or {}
    ttft = [x["ttft_ms"] for x in rows]
    tpot = [x["tpot_ms"] for x in rows if x["tpot_ms"] is not None]
    out_tokens = sum(x["output_tokens"] for x in rows)
    sim_s = max(end_s - first_arrival_s, 0.0)
    s = {
        "mode": cfg.mode,
        "model": cfg.model,
        "hardware": cfg.hardware,
        "split": cfg.split,
        "selection": cfg.selection,
        "policy_sampling": cfg.policy_sampling,
        "requests": n_requests,
        "requests_completed": len(rows),
        "requests_rejected": sum(rejections.values()),
        **{f"rejected_{why}": rejections.get(why, 0) for why in REJECT_REASONS},
        "output_tokens": out_tokens,
        "throughput_tok_s": _r(out_tokens / sim_s if sim_s > 0 else 0.0, 4),
        "tpot_ms_p50": _pct(tpot, 50),
        "tpot_ms_p99": _pct(tpot, 99),
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p99": _pct(ttft, 99),
        "preemptions": preemptions,
        "steps": steps,
        "h2d_bytes": _r(h2d_bytes, 0),
        "d2h_bytes": _r(d2h_bytes, 0),
        "net_bytes": _r(net_bytes, 0),
        "h2d_bytes_per_step": _r(h2d_bytes / steps if steps else 0.0, 1),
        "hbm_peak_bytes": _r(hbm_peak, 0),
        "host_peak_bytes": _r(host_peak, 0),
        "resident_recall": _r(recall_sum / recall_n if recall_n else 1.0),
        "stall_ms_total": _r(stall_s * 1e3, 4),
        "simulated_s": _r(sim_s),
    }
    if getattr(cfg, "host_kv_dtype", "auto") != "auto":  # likewise: an fp8 host copy says so
        s["host_kv_dtype"] = cfg.host_kv_dtype
    if getattr(cfg, "fetch_policy", None) is not None:  # only when chosen: default runs keep their bytes
        from oasis_core.fetchcap import get_policy

        s["fetch_policy"] = get_policy(cfg.fetch_policy).spec
    if extra:
        s.update(extra)
    return s


def provenance(cfg, trace_path) -> dict:
    """What produced a result: every ``SimConfig`` field (``config``) and the trace file (``trace``: its path and the
    sha256 of its bytes). ``run`` adds it to ``summary.json``; ``sweep`` flattens it into ``config.<field>``,
    ``trace.path`` and ``trace.sha256`` columns."""
    import hashlib

    h = hashlib.sha256()
    with open(trace_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"config": cfg.to_dict(), "trace": {"path": str(trace_path), "sha256": h.hexdigest()}}


def flat_provenance(prov: dict) -> dict:
    """``provenance`` as one level of ``section.field`` columns (``synthetic`` overrides as ``config.synthetic``,
    a JSON object)."""
    out = {}
    for section, values in prov.items():
        for k, v in values.items():
            out[f"{section}.{k}"] = json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
    return out


def finite_json(obj):
    """``obj`` with every NaN / ±Infinity float (at any depth of dicts, lists and tuples) replaced by None, so that
    the JSON written is standard (``json.dumps`` would write the non-standard ``NaN`` / ``Infinity``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def dumps_summary(summary: dict) -> str:
    """The summary as standard JSON: non-finite numbers become null (``finite_json``)."""
    return json.dumps(finite_json(summary), indent=2, sort_keys=True, allow_nan=False) + "\n"


def dumps_csv(rows: list[dict], columns) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row.get(k) is None else row[k]) for k in columns})
    return buf.getvalue()


def steps_csv(log) -> str:
    cols = ("t_s", "dur_ms", "decode", "prefill_tokens", "h2d_bytes", "net_bytes", "stall_ms")
    lines = [",".join(cols)]
    for t, d, n, p, h, nb, st in zip(log.t, log.dur, log.decode, log.prefill, log.h2d, log.net, log.stall):
        lines.append(f"{t:.6f},{d * 1e3:.4f},{n},{p},{h:.0f},{nb:.0f},{st * 1e3:.4f}")
    return "\n".join(lines) + "\n"


def memory_csv(series: dict) -> str:
    """series: name -> [(t, bytes)]; one row per change, columns t_s, pool, bytes."""
    lines = ["t_s,pool,bytes"]
    for name in sorted(series):
        for t, b in series[name]:
            lines.append(f"{t:.6f},{name},{b:.0f}")
    return "\n".join(lines) + "\n"
