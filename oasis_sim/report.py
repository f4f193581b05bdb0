"""What a run's numbers mean, said at the end of its table; and two runs side by side.

``overload_note(requests)``: a run whose queue grows -- requests that arrive late wait far longer to start than
those that arrived early -- is overloaded: its TTFT measures the queue, not the system, and grows with the trace's
length. Said when the median wait to be admitted of the last quarter of requests (by arrival) is at least
``GROWTH`` times that of the first quarter plus ``MIN_GROWTH_S`` seconds.

``compare_table(a, b)`` / ``python -m oasis_sim compare RUN_A RUN_B``: the headline figures of two runs'
``summary.json`` (a folder or the file) side by side with B / A, so dense vs lookahead needs no hand diffing.
"""

from __future__ import annotations

import json
import os
from statistics import median

GROWTH = 4.0  # the late quarter waits this many times the early quarter's wait ...
MIN_GROWTH_S = 1.0  # ... plus this many seconds


def overload_note(requests: list[dict]) -> str | None:
    """One line when the run was overloaded (see the module docstring), else None. ``requests``: rows of
    requests.csv (``arrival_s``, ``admit_s``, ``first_token_s``; unfinished requests have ``admit_s`` None)."""
    rows = sorted((r for r in requests if r.get("arrival_s") is not None), key=lambda r: r["arrival_s"])
    if len(rows) < 8:
        return None
    end = max((r.get("finish_s") or r["arrival_s"]) for r in rows)
    # a request never admitted waited until the run ended (at least)
    waits = [((r["admit_s"] if r.get("admit_s") is not None else end) - r["arrival_s"]) for r in rows]
    q = len(rows) // 4
    early, late = median(waits[:q]), median(waits[-q:])
    if late < GROWTH * early + MIN_GROWTH_S:
        return None
    ttft = [r["ttft_ms"] / 1e3 for r in rows if r.get("ttft_ms") is not None]
    ttft_note = f", TTFT p50 {median(ttft):,.1f} s" if ttft else ""
    return (
        f"overloaded: the queue grows (requests wait {early:,.1f} s to start early in the trace, {late:,.1f} s late"
        f"{ttft_note}); the arrivals exceed what this configuration serves, so TTFT measures the queue and grows "
        "with the trace's length. Fewer arrivals (--time-scale > 1, --max-requests), --arrival closed "
        "--concurrency N, or more capacity"
    )


# -- two runs -------------------------------------------------------------------------------------------------------

ROWS = (  # (label, summary key, digits, unit); lower is better unless noted
    ("throughput", "throughput_tok_s", 1, "tok/s"),
    ("TPOT p50", "tpot_ms_p50", 2, "ms"),
    ("TPOT p99", "tpot_ms_p99", 2, "ms"),
    ("TTFT p50", "ttft_ms_p50", 1, "ms"),
    ("TTFT p99", "ttft_ms_p99", 1, "ms"),
    ("requests completed", "requests_completed", 0, ""),
    ("requests rejected", "requests_rejected", 0, ""),
    ("preemptions", "preemptions", 0, ""),
    ("host->GPU", "h2d_bytes", 3, "GB"),
    ("network", "net_bytes", 3, "GB"),
    ("HBM peak", "hbm_peak_bytes", 3, "GB"),
    ("host peak", "host_peak_bytes", 3, "GB"),
    ("resident recall", "resident_recall", 4, ""),
    ("stall total", "stall_ms_total", 1, "ms"),
    ("simulated time", "simulated_s", 2, "s"),
)


def load_summary(path: str) -> dict:
    """The ``summary.json`` of a run folder (or the file itself); ``ValueError`` naming the file otherwise."""
    f = os.path.join(path, "summary.json") if os.path.isdir(path) else path
    try:
        with open(f, "rb") as fh:
            s = json.loads(fh.read().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"{f}: cannot read: {e.strerror or type(e).__name__}") from None
    except (ValueError, RecursionError):
        raise ValueError(f"{f}: not a summary.json (not JSON)") from None
    if not isinstance(s, dict) or "throughput_tok_s" not in s:
        raise ValueError(f"{f}: not a summary.json of `oasis-sim run` (no throughput_tok_s)")
    return s


def _cell(v, nd: int, unit: str) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "-"
    if unit == "GB":
        v = v / 1e9
    return f"{v:,.{nd}f}" + (f" {unit}" if unit else "")


def compare_table(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> str:
    """Both runs' figures and B / A, one row per figure; a first row names each run's mode, model and hardware."""
    head = [("", names[0], names[1], f"{names[1]} / {names[0]}")]
    head.append(("run", *(f"{s.get('mode')} / {s.get('model')} / {s.get('hardware')}" for s in (a, b)), ""))
    rows = []
    for label, key, nd, unit in ROWS:
        va, vb = a.get(key), b.get(key)
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        ratio = f"{vb / va:.2f}x" if ok and va else "-"
        rows.append((label, _cell(va, nd, unit), _cell(vb, nd, unit), ratio))
    table = head + rows
    w = [max(len(r[i]) for r in table) for i in range(4)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}".rstrip() for r in table)
