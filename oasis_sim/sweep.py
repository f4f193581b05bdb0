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

Every point is validated before anything runs (a bad value exits 2 naming the file, the point and the field), and
so are ``--workers`` (>= 1) and ``--out`` (a writable folder). Points run in a local process pool with a tqdm
progress bar; ``DIR/sweep.csv`` holds one row per point, in grid order: the point's parameters (``param.<name>``),
every summary field, ``wall_s``, ``error`` and the configuration that produced the row (``config.<field>`` for
every SimConfig field, ``trace.path``, ``trace.sha256``) — load it with ``pandas.read_csv``. A point that fails
(in its worker, or a worker that dies) keeps its row with ``error`` saying why; the CSV is still written and the
command then exits 2 naming the first failed point. Each point's own outputs are not kept (run it alone with
``oasis-sim run`` to get them).

Running the same sweep on a Ray cluster
---------------------------------------
The points are independent and pure (inputs → row dict), so any task runner scales them. With Ray (not a
dependency of the project; untested here)::

    import ray, pandas as pd
    from oasis_sim.sweep import load_grid, run_point

    ray.init(address="auto")                         # on a node of the cluster
    trace_path, points, _workers = load_grid("GRID.yaml")   # validated points
    remote = ray.remote(num_cpus=1)(run_point)
    rows = ray.get([remote.remote(trace_path, p) for p in points])
    pd.DataFrame(rows).to_csv("sweep.csv", index=False)

Ship the repository to the workers with ``ray.init(runtime_env={"working_dir": "."})`` (or ``pip install`` it
in the cluster image) and make the trace path valid on every node (a shared file system, or pass the trace text).
"""
from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor

from .config import ConfigError, make_config


def _points(path: str, obj: dict) -> tuple:
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: top level: must be a mapping with 'grid', got {type(obj).__name__}")
    for key in obj:
        if key not in ("trace", "base", "grid", "workers"):
            raise ConfigError(f"{path}: {key}: unknown key (allowed: trace, base, grid, workers)")
    base = obj.get("base") or {}
    grid = obj.get("grid")
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base: must be a mapping of SimConfig fields, got {base!r}")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{path}: grid: must be a non-empty mapping of field -> list of values, got {grid!r}")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{path}: grid.{k}: must be a non-empty list of values, got {v!r}")
    keys = list(grid)
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
    from .cli import load_config_file

    obj = load_config_file(path)
    trace = obj.get("trace")
    if trace is not None and not isinstance(trace, str):
        raise ConfigError(f"{path}: trace: must be a file path, got {trace!r}")
    workers = obj.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"{path}: workers: must be an integer >= 1, got {workers!r}")
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


def _run_local(trace, points, workers: int) -> list:
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    from tqdm import tqdm

    rows = [None] * len(points)
    if workers == 1:
        for i, p in enumerate(tqdm(points, desc="sweep", unit="pt")):
            rows[i] = run_point(trace, p)
        return rows
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futs = {pool.submit(run_point, trace, p): i for i, p in enumerate(points)}
        for fut in tqdm(as_completed(futs), total=len(futs), desc="sweep", unit="pt"):
            i = futs[fut]
            try:
                rows[i] = fut.result()
            except BrokenProcessPool:  # a worker died (killed for memory, ...): its point and the rest not run
                rows[i] = {**{f"param.{k}": v for k, v in points[i][0].items()},
                           "error": "BrokenProcessPool: the worker process died (out of memory?)"}
    return rows


def run_sweep(path: str, out_dir: str, workers: int | None = None) -> str:
    """Run every point of the grid file at ``path`` and write ``out_dir/sweep.csv``. Raises ``ConfigError`` for a
    bad grid, trace, worker count or output folder before any point runs, and after writing the CSV when a point
    failed (naming the first failed point and why)."""
    import pandas as pd

    from .cli import prepare_out_dir
    from .workloads import load_workload

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers: must be an integer >= 1, got {workers!r}")
    trace, points, file_workers = load_grid(path)
    prepare_out_dir(out_dir)
    load_workload(trace)  # a bad trace fails once, before the pool starts
    workers = min(workers or file_workers or os.cpu_count() or 1, len(points))
    rows = _run_local(trace, points, workers)
    out = os.path.join(out_dir, "sweep.csv")
    pd.DataFrame(rows).to_csv(out, index=False)
    failed = [i for i, r in enumerate(rows) if r.get("error")]
    print(f"wrote {out}: {len(rows)} points" + (f", {len(failed)} failed" if failed else ""))
    if failed:
        i = failed[0]
        raise ConfigError(f"sweep: {len(failed)} of {len(rows)} points failed (see the error column of {out}); "
                          f"first: {_label(i, points[i])}: {rows[i]['error']}")
    return out
