"""Helpers shared by the experiments: provenance of a result, step-log statistics, small formatting.

Every output of ``experiments/`` names the commit, the date and the machine it was produced on (``provenance()``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
MOONCAKE_TRACE = REPO / "traces" / "public" / "mooncake_conversation_trace.jsonl"  # default --trace of the scripts


def write_markdown(path: Path, lines: list, notes: Path) -> None:
    """Write ``lines`` to ``path``, followed by the hand-written notes file ``notes`` when it exists."""
    notes_file = Path(notes)
    if notes_file.is_file():
        lines = lines + ["", notes_file.read_text().rstrip()]
    Path(path).write_text("\n".join(lines) + "\n")


def ensure_repo_on_path() -> None:
    """Let ``python experiments/<question>/x.py`` import the repository's packages without an install."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def provenance() -> dict:
    from oasis_core import provenance as prov

    dirty = prov.status(("oasis_sim", "oasis_core"))
    import hashlib

    h = hashlib.sha256()
    for f in sorted(list((REPO / "oasis_sim").glob("*.py")) + list((REPO / "oasis_core").glob("*.py"))):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "commit": prov.commit(),
        "sim_tree_dirty": bool(dirty),
        "sim_tree_dirty_files": dirty.replace("\n", "; ") if dirty else "",
        "sim_source_sha256": h.hexdigest()[:16],
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
    }


def provenance_md(p: dict) -> str:
    dirty = (
        f" plus uncommitted changes in the working tree ({p.get('sim_tree_dirty_files', '')})"
        if p["sim_tree_dirty"]
        else ""
    )
    return (
        f"Commit `{p['commit']}`{dirty}; oasis_sim + oasis_core sources sha256 "
        f"`{p.get('sim_source_sha256', '?')}` (read when the script started); {p['date_utc']}; machine: "
        f"{p['machine']}."
    )


def step_stats(log, warmup_s: float = 0.0) -> dict:
    """Statistics of an engine ``StepLog``.

    - ``running_batch``: time-weighted mean of requests decoding, over all steps (prefill steps included);
    - ``decode_tok_s``: output tokens per second over the steps that did no prefill work (decode phase);
    - ``decode_step_ms``: median duration of those steps;
    - ``h2d_bytes_per_decode_step`` (mean) and ``_p50`` (median: the steady state; the mean includes the first
      steps of fresh requests, whose drift is still building up); ``h2d_gb_s_decode``: bytes / time of those steps;
    - ``decode_time_share``: share of the simulated time spent in pure-decode steps.
    """
    t = np.asarray(log.t)
    dur = np.asarray(log.dur)
    dec = np.asarray(log.decode, dtype=float)
    pf = np.asarray(log.prefill, dtype=float)
    h2d = np.asarray(log.h2d, dtype=float)
    keep = t >= warmup_s
    t, dur, dec, pf, h2d = t[keep], dur[keep], dec[keep], pf[keep], h2d[keep]
    pure = (pf == 0) & (dec > 0)
    total = dur.sum()
    out = {
        "running_batch": float((dec * dur).sum() / total) if total > 0 else 0.0,
        "decode_tok_s": float(dec[pure].sum() / dur[pure].sum()) if pure.any() else 0.0,
        "decode_step_ms": float(np.median(dur[pure]) * 1e3) if pure.any() else 0.0,
        "decode_batch": float(np.median(dec[pure])) if pure.any() else 0.0,
        "h2d_bytes_per_decode_step": float(h2d[pure].mean()) if pure.any() else 0.0,
        "h2d_bytes_per_decode_step_p50": float(np.median(h2d[pure])) if pure.any() else 0.0,
        "h2d_gb_s_decode": float(h2d[pure].sum() / dur[pure].sum() / 1e9) if pure.any() else 0.0,
        "decode_time_share": float(dur[pure].sum() / total) if total > 0 else 0.0,
    }
    return out


def pct_diff(sim, paper):
    """(sim - paper) / paper in percent, or None."""
    if sim is None or paper is None or paper == 0:
        return None
    return 100.0 * (sim - paper) / paper


def fmt(x, nd=1):
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    return f"{x:,.{nd}f}"


def fmt_pct(x):
    return "–" if x is None else f"{x:+.0f}%"


def read_jsonl(path) -> list:
    """The JSON-object lines of ``path`` (a missing file: none; lines that do not parse or are not objects are
    skipped: a run killed mid-write leaves a partial last line)."""
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict):
                out.append(r)
    return out


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
