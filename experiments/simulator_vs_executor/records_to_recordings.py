"""Executor recordings from H200 bench records: one ``*.json`` recording per graph-mode bench record.

    python experiments/simulator_vs_executor/records_to_recordings.py [JSONL ...] [--out traces/recordings_fused]
                                             [--unfused-out DIR] [--dry-run]

Each JSONL line is one ``oasis_exec.tools.bench.run_bench`` record plus the runner's fields (``label``, ``kind``,
``status``, ``cuda_graph``, ``fused_ops``, ``uva_programs``, ...), as written by ``experiments/dense_vs_lookahead_throughput/h200_headline.py`` /
``h200_sweep_with_transfer_paths.py`` and ``experiments/transfer_paths/transfer_paths.py``. The records do not carry the run's
``ExecConfig``; it is rebuilt from their fields (:func:`exec_config_of`: mode, context, concurrency, kv_budget_gb, host_kv_gb,
fetch_ratio, top_k, transfer and the path it resolved to, uva_programs, no_transfer, fused_ops, cuda_graph,
synthetic parameters; the rest at the executor's defaults, which is what those runners used) and validated by
``ExecConfig`` itself, then ``oasis_exec.tools.recorder.recording_from_bench`` makes the recording. Files are named
``<label>_<commit>.json``; no selection ``.npz`` is written (the records hold no selected sets: the replay uses the
seeded synthetic generator with the recorded parameters).

Kept: ``status`` ok, CUDA-graph decode steps, fused kernels on, copies on. Skipped, with the reason printed per
label (:func:`classify`):

- not ``status: ok`` (``started`` markers are superseded by their ``ok`` line; ``error`` / ``skipped`` runs);
- eager steps (``cuda_graph`` false, including the profiled runs): launch-bound, 2.5-6.4x slower than the same
  graph-captured step, a different regime (``traces/recordings_eager/`` holds the older eager ones);
- no-transfer twins (``no_transfer``): the run planned selections but skipped the copies, which the simulator
  cannot express (its lookahead mode always copies what it plans); a replay would time copies the run skipped;
- fused-off twins (``fused_ops`` false): another executor (the plain torch ops and selection); written to
  ``--unfused-out`` when given, kept out of ``--out`` either way (``find_recordings`` is recursive, so the two
  folders are siblings, never nested);
- anything the recorder refuses (no hardware preset for the device, an invalid recording).

A log of every input line (written or skipped, and why) goes to ``<out>/_records_to_recordings.jsonl`` (``.jsonl``:
``find_recordings`` only picks ``*.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core.recording import RecordingError  # noqa: E402
from oasis_exec.config import ExecConfig  # noqa: E402
from oasis_exec.tools.recorder import TRANSFER_NAMES, write_bench_recording  # noqa: E402

DEFAULT_INPUTS = tuple(
    os.path.join(REPO, "experiments", f)
    for f in (
        "dense_vs_lookahead_throughput/results/headline_fused_ab.jsonl",
        "dense_vs_lookahead_throughput/results/headline_full_sweep.jsonl",
        "transfer_paths/results/uva_vs_host_in_step.jsonl",
    )
)
DEFAULT_OUT = os.path.join(REPO, "traces", "recordings_fused")
LOG_NAME = "_records_to_recordings.jsonl"
BENCH_KEYS = ("mode", "context", "concurrency", "steps", "tpot_ms_p50", "tpot_ms_p99", "throughput_tok_s")
# runner fields worth keeping with the recording (meta): what the simulator has no field for, and provenance
META_KEYS = (
    "label",
    "kind",
    "variant",
    "group",
    "preset",
    "role",
    "config",
    "exec",
    "uva_programs",
    "fused_ops",
    "cuda_graph",
    "transfer",
    "transfer_path",
    "drift_rate",
    "status_note",
)


def is_bench_record(r: dict) -> bool:
    return isinstance(r, dict) and all(k in r for k in BENCH_KEYS)


def classify(r: dict) -> tuple:
    """``(set, reason)``: set ``"fused"`` (the validation set), ``"unfused"`` (fused-off twin) or None (skip, with
    the reason)."""
    status = r.get("status", "ok")
    if status != "ok":
        return None, f"status {status}" + (f": {r['reason']}" if r.get("reason") else "")
    if not is_bench_record(r):
        missing = [k for k in BENCH_KEYS if k not in r]
        return None, f"not a bench record (no {', '.join(missing)})"
    if r.get("profile"):
        return None, "profiled run (per-layer CUDA events: eager step, not graph mode)"
    if not r.get("cuda_graph", False):
        return None, "eager step (cuda_graph false): not graph mode"
    if r.get("no_transfer"):
        return None, (
            "no-transfer twin: the simulator has no copy-less lookahead mode (a replay would time the "
            "copies the run skipped)"
        )
    if r.get("fused_ops") is False:
        return "unfused", "fused-off twin (plain torch ops and selection): another executor"
    return "fused", "ok"


def exec_config_of(r: dict) -> ExecConfig:
    """The run's ``ExecConfig`` rebuilt from the record (fields the record lacks: the executor's defaults, as the
    runners left them: seed 0, block size 16, dummy weights). ``transfer`` is the path the run took: a record of
    ``transfer=auto`` names it in ``transfer_path`` (``auto`` itself stays in the recording's ``exec_transfer``)."""
    sparse = r["mode"] != "dense"
    kw = dict(
        model=r.get("model") or "qwen3-8b",
        mode=r["mode"],
        selection=r.get("selection") or "synthetic",
        top_k=int(r.get("top_k", 128)),
        fetch_ratio=float(r.get("fetch_ratio", 0.05)),
        max_context=int(r["context"]) + int(r.get("warmup", 0)) + int(r["steps"]) + 32,
        kv_budget_gb=r.get("kv_budget_gb"),
        host_kv_gb=r.get("host_kv_gb"),
        max_lanes=r.get("max_lanes") or r.get("requested_concurrency") or r["concurrency"],
        no_transfer=bool(r.get("no_transfer", False)),
        fused_ops=r.get("fused_ops", True) is not False,
        cuda_graph=bool(r.get("cuda_graph", True)),
        profile=bool(r.get("profile", False)),
        synthetic=r.get("synthetic_params") or None,
        fetch_policy=r.get("fetch_policy") or None,
        decode_chain=int(r.get("decode_chain", 1) or 1),  # records before it: one decode step a scheduler step
    )
    if r.get("uva_programs"):
        kw["uva_programs"] = int(r["uva_programs"])
    if sparse and r.get("transfer"):
        kw["transfer"] = r["transfer"]
    return ExecConfig(**kw)


def bench_of(r: dict) -> dict:
    """The record as the recorder reads it: ``transfer`` is made to name the path the run took when the record's
    ``transfer`` (e.g. ``auto``) would map to another one."""
    b = dict(r)
    took = r.get("transfer_path")
    if (
        r["mode"] != "dense"
        and took
        and TRANSFER_NAMES.get(r.get("transfer"), r.get("transfer")) != TRANSFER_NAMES.get(took, took)
    ):
        b["transfer"] = took
    return b


def recording_name(r: dict) -> str:
    label = str(r.get("label") or f"{r['mode']}-{r['context']}-c{r['concurrency']}")
    safe = "".join(ch if ch.isalnum() or ch in "-._" else "-" for ch in label)
    return f"{safe}_{r.get('commit') or 'unknown'}.json"


def read_records(paths: Iterable[str]) -> list:
    """``(path, line number, record)`` of every JSON line of every file."""
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    out.append((p, i, json.loads(line)))
    return out


def convert(
    paths: Iterable[str], out_dir: str, unfused_dir: Optional[str] = None, dry_run: bool = False, log=print
) -> dict:
    """Convert every record; returns ``{"written": [...], "skipped": [...]}`` (one dict per input line: source,
    line, label, commit, file or reason)."""
    rows = read_records(paths)
    ok_labels = {(p, r.get("label")) for p, _i, r in rows if r.get("status", "ok") == "ok"}
    written, skipped, names = [], [], {}
    for p, i, r in rows:
        src = os.path.relpath(p, REPO)
        entry = {"source": src, "line": i, "label": r.get("label"), "commit": r.get("commit")}
        if r.get("status") == "started" and (p, r.get("label")) in ok_labels:
            skipped.append(dict(entry, reason="started marker (its result is the ok line)", quiet=True))
            continue
        kind, reason = classify(r)
        target = {"fused": out_dir, "unfused": unfused_dir}.get(kind)
        if target is None:
            skipped.append(dict(entry, reason=reason if kind is None else f"{reason} (no --unfused-out)"))
            continue
        name = recording_name(r)
        path = os.path.join(target, name)
        if path in names:
            raise ValueError(f"{src}:{i}: {name} again (first from {names[path]}): labels must be unique per commit")
        names[path] = f"{src}:{i}"
        meta = {
            "made_by": "experiments/simulator_vs_executor/records_to_recordings.py",
            "source": src,
            "source_line": i,
            "cuda_graph": bool(r.get("cuda_graph")),
        }
        meta.update({f"bench_{k}": r[k] for k in META_KEYS if r.get(k) is not None and k != "cuda_graph"})
        try:
            cfg = exec_config_of(r)
            if dry_run:
                from oasis_exec.tools.recorder import recording_from_bench

                recording_from_bench(bench_of(r), cfg, meta=meta, source=path)
            else:
                os.makedirs(target, exist_ok=True)
                write_bench_recording(path, bench_of(r), cfg, meta=meta)
        except (ValueError, RecordingError) as e:
            skipped.append(dict(entry, reason=f"recorder: {' '.join(str(e).split())}"))
            continue
        written.append(dict(entry, set=kind, file=os.path.relpath(path, REPO)))
    for w in written:
        log(f"wrote   {w['file']}" + (" (fused-off twin)" if w["set"] == "unfused" else ""))
    quiet = sum(1 for s in skipped if s.get("quiet"))
    for s in skipped:
        if not s.get("quiet"):
            log(f"skipped {s['label']} ({s['source']}:{s['line']}, {s['commit']}): {s['reason']}")
    log(
        f"{len(written)} recordings ({sum(w['set'] == 'fused' for w in written)} fused, "
        f"{sum(w['set'] == 'unfused' for w in written)} fused-off), {len(skipped) - quiet} records skipped, "
        f"{quiet} started markers"
    )
    if not dry_run:
        logs = {out_dir: [w for w in written if w["set"] == "fused"] + [s for s in skipped if not s.get("quiet")]}
        if unfused_dir:
            logs[unfused_dir] = [w for w in written if w["set"] == "unfused"]
        for d, entries in logs.items():
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, LOG_NAME), "w", encoding="utf-8", newline="\n") as f:
                for e in entries:
                    f.write(json.dumps({k: v for k, v in e.items() if k != "quiet"}, sort_keys=True) + "\n")
    return {"written": written, "skipped": skipped}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "inputs",
        nargs="*",
        default=list(DEFAULT_INPUTS),
        metavar="JSONL",
        help="bench record files (default: the three H200 issue-5 files of 2026-11-30)",
    )
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder of the recordings (default %(default)s)")
    ap.add_argument(
        "--unfused-out",
        default=None,
        metavar="DIR",
        help="write the fused-off twins here (a sibling of --out, never inside it); default: skip them",
    )
    ap.add_argument("--dry-run", action="store_true", help="build and check the recordings, write nothing")
    a = ap.parse_args(argv)
    out, unf = os.path.abspath(a.out), os.path.abspath(a.unfused_out) if a.unfused_out else None
    if unf and (unf == out or unf.startswith(out + os.sep) or out.startswith(unf + os.sep)):
        ap.error("--unfused-out must not be --out or nested with it (find_recordings is recursive)")
    convert(a.inputs or DEFAULT_INPUTS, out, unf, dry_run=a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
