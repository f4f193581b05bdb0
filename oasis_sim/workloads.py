"""Workloads: trace files (``oasis_core.trace``), closed-loop fixed concurrency, open-loop Poisson.

- ``trace``: requests arrive at the trace's ``arrival_s`` (times ``time_scale``).
- ``closed``: ``concurrency`` requests are in flight from t = 0; each completion releases the next request of the
  trace at that instant (the paper's Fig. 11 setting: maximum concurrency); arrival times in the trace are ignored.
- ``poisson``: arrivals from a seeded exponential inter-arrival process at ``rate_rps``; prompt/output lengths
  are the trace's, in order.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

import numpy as np

from oasis_core.importers import fit_context
from oasis_core.trace import Trace, TraceError, load_trace

from .config import SimConfig
from .scheduler import Req

BUNDLED_NAME = "mooncake_slice.json"


def bundled_trace_path() -> Path:
    """The bundled Mooncake slice: ``traces/`` of a source checkout if present, else the package's copy
    (``oasis_sim/data/``, installed as package data)."""
    repo = Path(__file__).resolve().parent.parent / "traces" / BUNDLED_NAME
    if repo.is_file():
        return repo
    try:
        return Path(str(resources.files("oasis_sim") / "data" / BUNDLED_NAME))
    except (ModuleNotFoundError, AttributeError):  # pragma: no cover - very old importlib
        return Path(__file__).resolve().parent / "data" / BUNDLED_NAME


# Traces larger than this are streamed (oasis_core.trace_stream) behind a tqdm progress bar on stderr.
PROGRESS_BYTES = 32 * 2**20
# The latest arrival a run may simulate: 1e8 s (~3 years). Times are absolute floats, so at 1e8 s their spacing
# is 1.5e-8 s, below the 1e-7 s (4 decimals of ms) TTFT and TPOT are reported at; far later arrivals would round
# short latencies to 0.
MAX_ARRIVAL_S = 1e8


def _load_large(path, size: int) -> Trace:
    """A trace of ``PROGRESS_BYTES`` or more: streamed (``oasis_core.trace_stream``), a progress bar on stderr."""
    from tqdm import tqdm

    from oasis_core.trace_stream import load_trace_stream

    with tqdm(
        total=size,
        unit="B",
        unit_scale=True,
        desc=f"reading {Path(path).name}",
        file=sys.stderr,
        leave=False,
    ) as bar:
        return load_trace_stream(path, progress=bar.update)


def load_workload(path) -> Trace:
    """Load and validate a trace (raises ``TraceError`` with a one-line message); a file of ``PROGRESS_BYTES`` or
    more is streamed in 1 MiB chunks (each request checked as it arrives) with a progress bar on stderr."""
    if path is not None and os.path.isdir(path):
        raise TraceError(f"{path}: cannot read: is a directory")
    path = bundled_trace_path() if path is None else path
    try:
        size = os.path.getsize(path)
    except OSError:
        return load_trace(path)  # its own one-line "cannot read" error
    return _load_large(path, size) if size >= PROGRESS_BYTES else load_trace(path)


def make_requests(trace: Trace, cfg: SimConfig) -> list[Req]:
    """The run's requests (lengths clipped to the context limit, arrivals per ``cfg.arrival``); refuses a
    configuration whose selection simulation would not fit in memory (``limits.check_footprint``)."""
    reqs = trace.requests
    if cfg.max_requests is not None:
        reqs = reqs[: cfg.max_requests]
    max_ctx = cfg.max_context if cfg.max_context is not None else cfg.model_spec.max_context_tokens
    out = []
    t0 = reqs[0].arrival_s if reqs else 0.0
    if cfg.arrival == "poisson":
        rng = np.random.default_rng(np.random.PCG64(cfg.seed))
        arrivals = np.cumsum(rng.exponential(1.0 / cfg.rate_rps, size=len(reqs)))
    for i, q in enumerate(reqs):
        prompt, output = fit_context(q.prompt_tokens, q.output_tokens, max_ctx)
        if cfg.arrival == "trace":
            arrival = (q.arrival_s - t0) * cfg.time_scale
        elif cfg.arrival == "poisson":
            arrival = float(arrivals[i])
        else:
            arrival = 0.0
        ids = q.prefix_block_ids
        if ids is not None:
            ids = ids[: -(-prompt // q.prefix_block_tokens)]
        r = Req(q.id, arrival, prompt, output, ids, q.prefix_block_tokens)
        r.ready_t = arrival
        out.append(r)
    from .config import ConfigError
    from .limits import check_footprint, check_rates

    last = max((r.arrival for r in out), default=0.0)
    if last > MAX_ARRIVAL_S:
        name = "rate_rps" if cfg.arrival == "poisson" else "time_scale"
        raise ConfigError(
            f"{name}: {getattr(cfg, name)!r} puts the last arrival at {last:.3g} s, later than "
            f"{MAX_ARRIVAL_S:.0e} s, where float times lose the 0.1 us precision latencies are reported at"
        )
    check_rates(cfg)
    bs = cfg.block_size
    check_footprint(
        cfg, [-(-(r.prompt + (r.output + 1) // 2) // bs) for r in out], min(cfg.max_batch, cfg.concurrency or len(out))
    )
    return out


class ClosedLoop:
    """Keeps ``concurrency`` requests in flight: the first N at t = 0, then one per request that ends (completed or
    rejected)."""

    def __init__(self, reqs: list[Req], concurrency: int, submit):
        self.pending = list(reversed(reqs))
        self.submit = submit
        self._owed = 0  # releases due; a rejected submission ends at once and asks for the next one re-entrantly
        self._releasing = False
        self._release(0.0, min(concurrency, len(self.pending)))

    def _release(self, now: float, n: int) -> None:
        self._owed += n
        if self._releasing:
            return
        self._releasing = True
        while self._owed and self.pending:
            self._owed -= 1
            r = self.pending.pop()
            r.arrival = now
            r.ready_t = now
            self.submit(r)
        self._owed = 0
        self._releasing = False

    def on_done(self, _req, now: float) -> None:
        self._release(now, 1)

    def more(self) -> bool:
        return bool(self.pending)


def uniform_trace(n: int, prompt_tokens: int, output_tokens: int, gap_s: float = 0.0, prefix_ids=None):
    """A hand-made trace of ``n`` equal requests arriving every ``gap_s`` seconds (tests, examples)."""
    from oasis_core.trace import TraceRequest

    reqs = []
    for i in range(n):
        ids = None if prefix_ids is None else tuple(prefix_ids(i))
        reqs.append(
            TraceRequest(
                id=i,
                arrival_s=i * gap_s,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                prefix_block_ids=ids,
                prefix_block_tokens=None if ids is None else 512,
            )
        )
    return Trace(requests=tuple(reqs))
