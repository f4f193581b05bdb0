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


def request_rows(done, bpbh: float) -> list[dict]:
    rows = []
    rnd = round  # (_r inlined where the value is never None: the hot loop of a long trace)
    for r in sorted(done, key=lambda r: r.id):
        tpot = ((r.finish_t - r.first_token_t) / (r.output - 1) * 1e3) if r.output > 1 else None
        rows.append(
            {
                "id": r.id,
                "arrival_s": rnd(float(r.arrival), 6),
                "prompt_tokens": r.prompt,
                "output_tokens": r.output,
                "admit_s": _r(r.admit_t),
                "first_token_s": _r(r.first_token_t),
                "finish_s": rnd(float(r.finish_t), 6),
                "ttft_ms": rnd(float((r.first_token_t - r.arrival) * 1e3), 4),
                "tpot_ms": None if tpot is None else rnd(float(tpot), 4),
                "preemptions": r.preempted,
                "prefix_hit_tokens": r.prefix_hit_tokens,
                "fetched_slices": rnd(float(r.fetch_blocks), 2),
                "h2d_bytes": rnd(float(r.fetch_blocks * bpbh), 0),
                "net_bytes": rnd(float(r.net_bytes), 0),
                "stall_ms": rnd(float(r.stall_s * 1e3), 4),
                "resident_recall": rnd(float(r.recall_sum / r.recall_n if r.recall_n else 1.0), 6),
            }
        )
    return rows


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
