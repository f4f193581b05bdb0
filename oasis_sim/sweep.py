"""``python -m oasis_sim sweep GRID.yaml --out DIR``: the cartesian product of any ``SimConfig`` fields.

GRID.yaml::

    trace: traces/mooncake_slice.json   # optional; default the bundled slice
    base:                               # optional; fields every point shares
      model: qwen3-8b
      max_requests: 100
    grid:                               # field -> list of values; the product is run
      mode: [dense, lookahead]
      concurrency: [16, 32, 64]
      synthetic.drift_rate: [0.05, 0.11]   # a SyntheticParams field
    workers: 2                          # optional; default: CPU count

At most ``MAX_POINTS`` points (counted before any is built). Every point is validated before anything runs (a bad value exits 2 naming the file, the point and the field), and
so are ``--workers`` (>= 1) and ``--out`` (a writable folder). Points run in a local process pool with a tqdm
progress bar; ``DIR/sweep.csv`` holds one row per point, in grid order: the point's parameters (``param.<name>``),
every summary field, ``wall_s``, ``error`` and the configuration that produced the row (``config.<field>`` for
every SimConfig field, ``trace.path``, ``trace.sha256``) — load it with ``pandas.read_csv``. A point that fails
(in its worker, or a worker that dies) keeps its row with ``error`` saying why; the CSV is still written and the
command then exits 2 naming the first failed point. Each point's own outputs are not kept (run it alone with
``oasis-sim run`` to get them).

``--ray ADDRESS`` runs the points as Ray tasks instead (``pip install 'oasiskv[sweep]'``): ``local`` starts a
local Ray instance for the sweep (``--workers`` or the file's ``workers`` CPUs, default all) and stops it after;
any other ADDRESS (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``) joins a running cluster, whose own CPUs set the
parallelism. Every node must import this package and read the trace at the same path (a shared file system, or
the package installed in the cluster image). The rows are the local sweep's: same columns, values and order, a
failing point (or a task whose worker died) keeping its row with ``error`` set; only ``wall_s`` differs run to
run. SIGINT / SIGTERM stop either way within seconds, write the finished rows and exit 128 + signal
(``oasis_sim.sweep_stop``). See docs/sweeps.md.
"""

from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

from oasis_core.echo import show

from .config import ConfigError, make_config
from .sweep_stop import SweepInterrupted, init_worker, signal_name, stop_pool, stop_signals

MAX_POINTS = 10_000  # points one grid file may hold (counted before any is built); docs/sweeps.md


def _points(path: str, obj: dict) -> tuple:
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: top level: must be a mapping with 'grid', got {type(obj).__name__}")
    for key in obj:
        if key not in ("trace", "base", "grid", "workers"):
            raise ConfigError(f"{path}: {key}: unknown key (allowed: trace, base, grid, workers)")
    base = obj.get("base") or {}
    grid = obj.get("grid")
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base: must be a mapping of SimConfig fields, got {show(base)}")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{path}: grid: must be a non-empty mapping of field -> list of values, got {show(grid)}")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{path}: grid.{k}: must be a non-empty list of values, got {show(v)}")
    keys = list(grid)
    count = math.prod(len(grid[k]) for k in keys)
    if count > MAX_POINTS:
        sizes = " x ".join(str(len(grid[k])) for k in keys)
        raise ConfigError(
            f"{path}: grid: {sizes} = {count:,} points, more than the {MAX_POINTS:,} a sweep runs "
            "(split the grid into several files)"
        )
    points = []
    for i, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        values = dict(base)
        syn = dict(values.get("synthetic") or {})
        for k, v in zip(keys, combo):
            if str(k).startswith("synthetic."):
                syn[k.split(".", 1)[1]] = v
            else:
                values[k] = v
        if syn:
            values["synthetic"] = syn
        try:
            make_config(values)
        except ConfigError as e:
            label = ", ".join(f"{k}={v}" for k, v in zip(keys, combo))
            raise ConfigError(f"{path}: point {i} ({label}): {e}") from None
        points.append((dict(zip(keys, combo)), values))
    return points


def load_grid(path: str):
    """(trace path or None, [(point params, SimConfig field values)]) after validating every point."""
    from .files import load_config_file

    obj = load_config_file(path)
    trace = obj.get("trace")
    if trace is not None and not isinstance(trace, str):
        raise ConfigError(f"{path}: trace: must be a file path, got {show(trace)}")
    workers = obj.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"{path}: workers: must be an integer >= 1, got {show(workers)}")
    if trace is not None and not os.path.isabs(trace) and not os.path.exists(trace):
        near = os.path.join(os.path.dirname(os.path.abspath(path)), trace)
        if os.path.exists(near):
            trace = near
    return trace, _points(path, obj), workers


def run_point(trace_path, point) -> dict:
    """Run one point; returns its CSV row: parameters (``param.<name>``), summary fields, ``wall_s``, ``error``
    (empty, or why the point failed, in which case the other columns are missing) and the configuration that
    produced it (``metrics.flat_provenance``: ``config.<field>`` for every SimConfig field, ``trace.path``,
    ``trace.sha256``)."""
    from .metrics import flat_provenance, provenance
    from .sim import simulate
    from .workloads import bundled_trace_path, load_workload

    params, values = point
    row = {f"param.{k}": v for k, v in params.items()}
    try:
        cfg = make_config(values)
        result = simulate(cfg, load_workload(trace_path))
    except Exception as e:  # noqa: BLE001 - one point's failure is that row's result, not the sweep's end
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
        return row
    row.update(result.summary)
    row["wall_s"] = round(result.wall_s, 4)
    row["error"] = ""
    row.update(flat_provenance(provenance(cfg, trace_path or bundled_trace_path())))
    return row


def _label(i: int, point) -> str:
    return f"point {i} ({', '.join(f'{k}={v}' for k, v in point[0].items())})"


def _failed_row(point, why: str) -> dict:
    """The row of a point that did not return one (its worker died): its parameters and ``error``."""
    return {**{f"param.{k}": v for k, v in point[0].items()}, "error": why}


def _run_local(trace, points, workers: int) -> list:
    """Rows in grid order; ``None`` for a point that did not finish when a stop signal arrived (raised as
    ``SweepInterrupted`` with the rows so far in ``.rows``)."""
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    from tqdm import tqdm

    rows = [None] * len(points)
    if workers == 1:
        try:
            for i, p in enumerate(tqdm(points, desc="sweep", unit="pt")):
                rows[i] = run_point(trace, p)
        except SweepInterrupted as stop:
            stop.rows = rows
            raise
        return rows
    pool = ProcessPoolExecutor(max_workers=workers, initializer=init_worker)
    try:
        futs = {pool.submit(run_point, trace, p): i for i, p in enumerate(points)}
        for fut in tqdm(as_completed(futs), total=len(futs), desc="sweep", unit="pt"):
            i = futs[fut]
            try:
                rows[i] = fut.result()
            except BrokenProcessPool:  # a worker died (killed for memory, ...): its point and the rest not run
                rows[i] = _failed_row(points[i], "BrokenProcessPool: the worker process died (out of memory?)")
    except BaseException as stop:
        stop_pool(pool)
        if isinstance(stop, SweepInterrupted):
            stop.rows = rows
        raise
    pool.shutdown()
    return rows


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) that takes no TCP connection is refused at once: Ray's own client
    would retry it for minutes. Other forms (``auto``) are left to Ray."""
    import re
    import socket

    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]/]+?)\]?:(\d{1,5})", address.strip())
    if not m:
        return
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"--ray {address}: cannot reach it: {e.strerror or type(e).__name__}") from None


def _start_ray(address: str, workers: Optional[int]) -> bool:
    """Connect to Ray (``local``: a new local instance of ``workers`` CPUs); True when this call started it (the
    caller then shuts it down). An already initialised Ray (a driver script's own ``ray.init``) is used as is."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray: Ray is not installed (pip install 'oasiskv[sweep]', or pip install ray)") from None
    if ray.is_initialized():
        return False
    import logging

    local = address == "local"
    if not local:
        _check_reachable(address)
    try:
        ray.init(
            address=None if local else address,
            num_cpus=workers if local else None,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    except Exception as e:  # noqa: BLE001 - ray raises ConnectionError, ValueError, RuntimeError, ...
        raise ConfigError(
            f"--ray {address}: cannot start or join Ray: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        ) from None
    return True


def _run_ray(trace, points, address: str, workers: Optional[int]) -> list:
    """The points as Ray tasks (one CPU each, no retries: a failure is the row's, as in the local pool), rows in
    grid order."""
    started = _start_ray(address, workers)
    import ray

    rows = [None] * len(points)
    pending = []
    try:
        # Ray's core worker replaced the handlers (its own SIGTERM handler aborts the process): set ours again
        with stop_signals(raise_=False) as stop:
            return _wait_ray(ray, trace, points, rows, pending, stop)
    except SweepInterrupted as stop:
        for ref in pending:  # queued and running tasks: their workers are killed, nothing is retried
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a task that ended meanwhile
                pass
        stop.rows = rows
        raise
    finally:
        if started:
            ray.shutdown()


def _wait_ray(ray, trace, points, rows: list, pending: list, stop) -> list:
    """Submit the points, fill ``rows`` as tasks end; ``pending`` holds the refs not yet returned; ``stop.check()``
    raises ``SweepInterrupted`` once a stop signal arrived."""
    from tqdm import tqdm

    task = ray.remote(num_cpus=1, max_retries=0)(run_point)
    for p in points:  # pending from the first: a stop while submitting cancels what was submitted
        pending.append(task.remote(trace, p))
        stop.check()
    refs = list(pending)
    index = {ref: i for i, ref in enumerate(refs)}
    with tqdm(total=len(refs), desc="sweep", unit="pt") as bar:
        while pending:
            # a bounded wait: a stop signal is noted during Ray's C++ call and acted on here
            done, pending[:] = ray.wait(pending, num_returns=1, timeout=0.25)
            for ref in done:
                i = index[ref]
                try:
                    rows[i] = ray.get(ref)
                except ray.exceptions.RayError as e:  # the worker died, was killed for memory, ...
                    first = (str(e).strip().splitlines() or [""])[0]
                    rows[i] = _failed_row(points[i], f"{type(e).__name__}: {first}"[:500])
                bar.update(1)
            stop.check()
    return rows


def run_sweep(path: str, out_dir: str, workers: int | None = None, ray_address: str | None = None) -> str:
    """Run every point of the grid file at ``path`` and write ``out_dir/sweep.csv``: in a local process pool, or as
    Ray tasks with ``ray_address`` (``"local"``: a local instance started for the sweep; else a running cluster's
    address). Raises ``ConfigError`` for a bad grid, trace, worker count, output folder or Ray address before any
    point runs, and after writing the CSV when a point failed (naming the first failed point and why)."""
    import pandas as pd

    from .files import prepare_out_dir
    from .workloads import load_workload

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers: must be an integer >= 1, got {show(workers)}")
    trace, points, file_workers = load_grid(path)
    prepare_out_dir(out_dir)
    load_workload(trace)  # a bad trace fails once, before the pool starts
    if ray_address is not None and (not isinstance(ray_address, str) or not ray_address.strip()):
        raise ConfigError(f"--ray: must be 'local' or a Ray cluster address, got {show(ray_address)}")
    out = os.path.join(out_dir, "sweep.csv")
    try:
        with stop_signals():
            if ray_address is not None:
                rows = _run_ray(trace, points, ray_address, workers or file_workers)
            else:
                rows = _run_local(trace, points, min(workers or file_workers or os.cpu_count() or 1, len(points)))
    except SweepInterrupted as stop:
        rows = getattr(stop, "rows", None) or [None] * len(points)
        done = sum(r is not None for r in rows)
        why = f"not run: the sweep was stopped ({signal_name(stop.signum)})"
        rows = [r if r is not None else _failed_row(p, why) for r, p in zip(rows, points)]
        pd.DataFrame(rows).to_csv(out, index=False)
        stop.note = f"sweep: stopped by {signal_name(stop.signum)}; wrote {out}: {done} of {len(rows)} points run"
        raise
    pd.DataFrame(rows).to_csv(out, index=False)
    failed = [i for i, r in enumerate(rows) if r.get("error")]
    print(f"wrote {out}: {len(rows)} points" + (f", {len(failed)} failed" if failed else ""))
    if failed:
        i = failed[0]
        raise ConfigError(
            f"sweep: {len(failed)} of {len(rows)} points failed (see the error column of {out}); "
            f"first: {_label(i, points[i])}: {rows[i]['error']}"
        )
    return out
