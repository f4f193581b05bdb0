"""The engine's transfer path, chosen by measurement (``ExecConfig.transfer="auto"``).

``oasis_exec/transfer/table.json`` is the committed choice table::

    {"source": "<results file the choices come from, and how>", "device": ..., "date": ..., "commit": ...,
     "choices": [{"concurrency": 16, "path": "uva", "uva_programs": 32, "tpot_ms": 19.40, ...}, ...]}

``experiments/transfer_paths/transfer_paths.py --summarize`` writes it from an H200 run (per concurrency, the configuration with the
lowest TPOT p50 inside the real decode step). ``choose(concurrency)`` picks the entry whose concurrency is nearest
to the engine's lane count (ties: the smaller concurrency) and returns ``(path, uva_programs)``; a host entry may
also carry ``host_threads`` and ``host_kernel`` ("torch" / "native"; absent = the engine's default), and any entry
``stream_priority`` (``config.PRIORITIES`` but auto: the side streams' CUDA priorities
that won; absent = normal) and ``copy_graph`` (true: the UVA copies as a graph of their own won; absent = false,
inside the step's graph)
(``explain`` returns the whole entry). Without a usable table the answer is the old
default, UVA on 32 programs, with the reason in ``explain(...)["reason"]`` and a warning.

torch-free: only json.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass

from oasis_core.echo import show

from ..config import STREAM_PRIORITIES

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table.json")
DEFAULT = ("uva", 32)  # ExecConfig's defaults: what "auto" meant before the table
PATHS = ("uva", "host")
PRIORITIES = tuple(STREAM_PRIORITIES)  # a table entry names one (not auto)
HOST_KERNELS = ("torch", "native")


class TableError(ValueError):
    pass


def load_table(table=None) -> dict:
    """The table as a dict: ``table`` may be None (the committed file), a path, or a dict. Raises ``TableError``
    (or ``FileNotFoundError``) naming what is wrong."""
    where = "table"
    if table is None or isinstance(table, (str, os.PathLike)):
        where = os.fspath(table if table is not None else TABLE)
        with open(where, "rb") as fh:
            try:
                table = json.loads(fh.read().decode("utf-8"))
            except ValueError as e:  # UnicodeDecodeError is one
                raise TableError(f"{where}: not JSON ({' '.join(str(e).split())[:200]})") from None
            except RecursionError:
                raise TableError(f"{where}: not JSON (nested too deeply)") from None
    if not isinstance(table, dict) or not isinstance(table.get("choices"), list) or not table["choices"]:
        raise TableError(f"{where}: needs a non-empty 'choices' list")
    for i, c in enumerate(table["choices"]):
        bad = lambda why: TableError(f"{where}: choices[{i}]: {why}, got {show(c)}")  # noqa: B023, E731
        if not isinstance(c, dict):
            raise bad("must be an object")
        n = c.get("concurrency")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise bad("concurrency must be an int >= 1")
        if c.get("path") not in PATHS:
            raise bad(f"path must be one of {PATHS}")
        p = c.get("uva_programs")
        if c["path"] == "uva" and (not isinstance(p, int) or isinstance(p, bool) or p < 1):
            raise bad("a uva entry needs uva_programs >= 1")
        t = c.get("host_threads")
        if t is not None and (not isinstance(t, int) or t < 1):
            raise bad("host_threads must be an int >= 1")
        if c.get("host_kernel", "torch") not in HOST_KERNELS:
            raise bad(f"host_kernel must be one of {HOST_KERNELS}")
        if c.get("stream_priority", "normal") not in PRIORITIES:
            raise bad(f"stream_priority must be one of {PRIORITIES}")
        if not isinstance(c.get("copy_graph", False), bool):
            raise bad("copy_graph must be true or false")
    return table


def explain(concurrency: int, table=None) -> dict:
    """The choice for ``concurrency`` lanes with its reason: ``{"path", "uva_programs", "host_threads",
    "host_kernel", "stream_priority", "copy_graph", "entry", "reason"}`` (``host_threads`` None unless a host entry
    names it; ``host_kernel`` likewise;
    ``uva_programs`` None for host; ``stream_priority`` "normal" unless the entry says "high"; ``copy_graph`` False
    unless the entry says true)."""
    try:
        tab = load_table(table)
    except (OSError, TableError) as e:
        path, progs = DEFAULT
        return {
            "path": path,
            "uva_programs": progs,
            "host_threads": None,
            "host_kernel": None,
            "stream_priority": "normal",
            "copy_graph": False,
            "entry": None,
            "reason": f"no usable transfer table ({type(e).__name__}: {e}); default {path} on {progs} programs",
        }
    best = min(tab["choices"], key=lambda c: (abs(c["concurrency"] - concurrency), c["concurrency"]))
    path = best["path"]
    progs = best["uva_programs"] if path == "uva" else None
    src = tab.get("source", "?")
    prio = best.get("stream_priority", "normal")
    return {
        "path": path,
        "uva_programs": progs,
        "host_threads": best.get("host_threads") if path == "host" else None,
        "host_kernel": best.get("host_kernel") if path == "host" else None,
        "stream_priority": prio,
        "copy_graph": best.get("copy_graph", False),
        "entry": best,
        "reason": f"table entry for concurrency {best['concurrency']} (nearest to {concurrency}): {path}"
        + (
            f" on {progs} programs"
            if path == "uva"
            else f" ({best['host_kernel']} gather)"
            if best.get("host_kernel")
            else ""
        )
        + (f", side streams at {prio} priority" if prio != "normal" else "")
        + f"; measured on {tab.get('device', '?')} {tab.get('date', '?')} (source: {src[:120]})",
    }


def choose(concurrency: int, table=None) -> tuple:
    """``(path, uva_programs)`` for an engine of ``concurrency`` lanes (``uva_programs`` None when path is host).
    Warns when the table is missing or unusable and the default is returned."""
    e = explain(concurrency, table)
    if e["entry"] is None:
        warnings.warn(e["reason"], RuntimeWarning, stacklevel=2)
    return e["path"], e["uva_programs"]


@dataclass(frozen=True)
class Route:
    """The transfer route of an engine (``route``): the path (``uva`` or ``host``), its UVA programs or host
    threads, the host path's gather kernel, the side streams' CUDA priority (``STREAM_PRIORITIES``) and, with
    ``transfer="auto"``, the table entry it came from (``explain``'s dict; else None)."""

    path: str
    uva_programs: int
    host_threads: int
    priority: str
    host_kernel: str
    choice: dict | None = None


def route(cfg, lanes: int) -> Route:
    """``cfg.transfer`` "uva" / "host": that path, on ``cfg.uva_programs`` programs / ``cfg.host_threads`` threads.
    "auto": path AND programs (threads, when a host entry names them) from the measured table for ``lanes`` lanes
    (``explain``); on-demand modes (copies on the critical path) always take the UVA path. ``cfg.host_kernel``
    "auto": the table's, else the C gather where it can be built."""
    path, programs, threads = cfg.transfer, cfg.uva_programs, cfg.host_threads
    priority = "normal" if cfg.stream_priority == "auto" else cfg.stream_priority
    kernel = cfg.host_kernel
    if kernel == "auto":
        from oasis_kernels.host_native import available

        kernel = "native" if available() else "torch"
    c = None
    if cfg.transfer == "auto":
        c = explain(lanes)
        if c["entry"] is None:
            warnings.warn(c["reason"], RuntimeWarning, stacklevel=3)
        path = c["path"]
        if cfg.stream_priority == "auto":
            priority = c["stream_priority"]
        if path == "uva":
            programs = c["uva_programs"]
        elif cfg.mode_spec.on_demand:  # copies on the critical path (fetch_now): no host-staged version there
            path = "uva"
        else:
            threads = c["host_threads"] or threads
            if cfg.host_kernel == "auto" and c["host_kernel"]:
                kernel = c["host_kernel"]
    return Route(path, programs, threads, priority, kernel, c)
