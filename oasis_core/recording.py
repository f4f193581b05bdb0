"""Executor recordings: a trace (``oasis_core.trace``) whose ``config`` holds the full configuration of a measured
run and whose ``results`` hold what the run measured. Documented in ``traces/SCHEMA.md`` ("Recordings").

A recording is what the simulator replays and is scored against::

    rec = build_recording(config={...}, results={...})      # validates; raises RecordingError
    save_recording(rec, "traces/recordings/x.json")
    rec = load_recording("traces/recordings/x.json")         # RecordingError("x.json: config.top_k: ...")

``RecordingError`` is a ``TraceError``: one line, ``<file>: <where>: <what is wrong>, got <value>``, exactly as
``load_trace`` words it. The optional selected block sets live beside the recording in a compressed ``.npz``
(``save_selection`` / ``load_selection``), named by ``results.selection_file``.

numpy only; no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from os import PathLike
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from . import modes
from .echo import show
from .geometry import HOST_KV_DTYPES
from .modes import MODES
from .trace import (
    MAX_REQUEST_TOKENS,
    Trace,
    TraceError,
    TraceRequest,
    _int_field,
    _key,
    _number_field,
    _Problem,
    _show,
    _show_typed,
    dumps_trace,
    load_trace,
    parse_trace,
)

KIND = "oasiskv-recording"
RECORDING_VERSION = 1

SELECTIONS = ("model", "synthetic", "replay")
TRANSFER_PATHS = ("dma", "uva")
TOPK_KERNELS = ("fused", "sort")  # config.topk_kernel: the executor's ExecConfig.topk_kernel
WORKLOADS = ("closed-loop", "trace")
# Stage names of results.stage_ms_per_step (ms per timed step, summed over layers). Others are stored as is.
STAGES = ("layers", "attn", "gemm", "pred", "select", "transfer", "host_gather", "stall")
SAMPLED_STEPS_MAX = 64  # recommended cap on results.steps entries
# Bounds on what a recording may claim, so that replaying a corrupt one is refused instead of simulating for days:
# 65,536 decode steps (warm-up and timed, each; the bench times 24) and 65,536 concurrent requests.
MAX_RECORDED_STEPS = 1 << 16
MAX_RECORDED_CONCURRENCY = 1 << 16

_CONFIG_REQUIRED = (
    "mode",
    "model",
    "hardware",
    "workload",
    "context",
    "concurrency",
    "kv_budget_gb",
    "top_k",
    "block_size",
    "fetch_ratio",
    "transfer_path",
    "selection",
    "seed",
    "warmup_steps",
    "steps",
)
_RESULTS_REQUIRED = (
    "tpot_ms_p50",
    "tpot_ms_p99",
    "throughput_tok_s",
    "ttft_ms_p50",
    "stage_ms_per_step",
    "bytes_per_step",
    "stall_ms_per_step",
    "hidden_fraction",
    "device",
    "date",
    "commit",
)


class RecordingError(TraceError):
    """A recording (or its selection file) is unreadable or invalid; one-line message naming file and field."""


# ----------------------------------------------------------------------------------------------------------------
# Field checks (raise _Problem like trace.py, so messages read the same)


def _str_field(where, value, choices=None, nullable=False):
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        raise _Problem(where, f"must be a non-empty string{' or null' if nullable else ''}, got {_show_typed(value)}")
    if choices is not None and value not in choices:
        raise _Problem(where, f"must be one of {', '.join(choices)}, got {_show(value)}")
    return value


def _num_or_null(where, value, minimum=0.0, maximum=None):
    if value is None:
        return None
    v = _number_field(where, value, minimum)
    if maximum is not None and v > maximum:
        raise _Problem(where, f"must be <= {maximum}, got {show(value)}")
    return v


def _missing(where: str, obj: Mapping, required: Sequence[str]) -> None:
    for k in required:
        if k not in obj:
            raise _Problem(_key(where, k), "missing required field")


def _check_config(c) -> None:
    if not isinstance(c, dict):
        raise _Problem("config", f"must be an object, got {_show_typed(c)}")
    _missing("config", c, _CONFIG_REQUIRED)
    _str_field("config.mode", c["mode"])
    try:
        mode = modes.get(c["mode"])
    except ValueError:
        raise _Problem("config.mode", f"must be one of {', '.join(MODES)}, got {_show(c['mode'])}") from None
    _str_field("config.model", c["model"])
    _str_field("config.hardware", c["hardware"])
    _str_field("config.workload", c["workload"], WORKLOADS)
    _int_field("config.context", c["context"], 1, MAX_REQUEST_TOKENS)
    _int_field("config.concurrency", c["concurrency"], 1, MAX_RECORDED_CONCURRENCY)
    if c["kv_budget_gb"] is not None:
        v = _number_field("config.kv_budget_gb", c["kv_budget_gb"], 0.0)
        if v <= 0:
            raise _Problem("config.kv_budget_gb", f"must be > 0 or null, got {show(c['kv_budget_gb'])}")
    _int_field("config.top_k", c["top_k"], 1)
    _int_field("config.block_size", c["block_size"], 1)
    fr = _number_field("config.fetch_ratio", c["fetch_ratio"], 0.0)
    if not 0.0 < fr <= 1.0:
        raise _Problem("config.fetch_ratio", f"must be in (0, 1], got {show(c['fetch_ratio'])}")
    _str_field("config.transfer_path", c["transfer_path"], TRANSFER_PATHS, nullable=True)
    if c["transfer_path"] is None and mode.transfers:
        raise _Problem(
            "config.transfer_path", f"must be one of {', '.join(TRANSFER_PATHS)} for mode {_show(c['mode'])}, got null"
        )
    _str_field("config.selection", c["selection"], SELECTIONS)
    _int_field("config.seed", c["seed"], 0)
    _int_field("config.warmup_steps", c["warmup_steps"], 0, MAX_RECORDED_STEPS)
    _int_field("config.steps", c["steps"], 1, MAX_RECORDED_STEPS)
    if c.get("host_kv_dtype") is not None:  # optional (recordings before it: the compute dtype, "auto")
        _str_field("config.host_kv_dtype", c["host_kv_dtype"], HOST_KV_DTYPES)
    if c.get("topk_kernel") is not None:  # optional: the prediction's top-K (null: none ran; absent: unknown)
        _str_field("config.topk_kernel", c["topk_kernel"], TOPK_KERNELS)
    if c.get("tensor_parallel") is not None:  # optional: the ranks of a tensor-parallel run (its rank 0 recorded)
        _int_field("config.tensor_parallel", c["tensor_parallel"], 1)
    if c.get("layer_windows") is not None:  # optional: per layer, null (full) or its window in tokens (hybrid)
        lw = c["layer_windows"]
        if not isinstance(lw, list) or not lw:
            raise _Problem("config.layer_windows", f"must be a non-empty list or null, got {_show_typed(lw)}")
        for i, w in enumerate(lw):
            if w is not None:
                _int_field(f"config.layer_windows[{i}]", w, 1)
    if c.get("speculative_k") is not None:  # optional: a speculative run's draft length (int, auto, auto:N)
        from .speculation import parse_spec

        try:
            parse_spec(c["speculative_k"], c["block_size"])
        except ValueError as e:
            raise _Problem("config.speculative_k", f"{e}, got {_show_typed(c['speculative_k'])}") from None


def _check_results(r, config) -> None:
    if not isinstance(r, dict):
        raise _Problem("results", f"must be an object, got {_show_typed(r)}")
    _missing("results", r, _RESULTS_REQUIRED)
    for k in ("tpot_ms_p50", "tpot_ms_p99", "throughput_tok_s"):
        _number_field(f"results.{k}", r[k], 0.0)
    if r["tpot_ms_p99"] < r["tpot_ms_p50"]:
        raise _Problem(
            "results.tpot_ms_p99",
            f"must be >= results.tpot_ms_p50 ({show(r['tpot_ms_p50'])}), got {show(r['tpot_ms_p99'])}",
        )
    _num_or_null("results.ttft_ms_p50", r["ttft_ms_p50"])
    _num_or_null("results.stall_ms_per_step", r["stall_ms_per_step"])
    _num_or_null("results.hidden_fraction", r["hidden_fraction"], 0.0, 1.0)
    for name in ("stage_ms_per_step", "bytes_per_step"):
        obj = r[name]
        if not isinstance(obj, dict):
            raise _Problem(f"results.{name}", f"must be an object, got {_show_typed(obj)}")
        for k, v in obj.items():
            _number_field(_key(f"results.{name}", k), v, 0.0)
    for k in ("device", "date", "commit"):
        _str_field(f"results.{k}", r[k])
    if "layer_events" in r:
        _check_layer_events(r["layer_events"])
    if r.get("accepted_hist") is not None:
        try:
            check_accepted_hist(r["accepted_hist"])
        except ValueError as e:
            raise _Problem("results.accepted_hist", str(e)) from None
    steps = r.get("steps")
    if steps is not None and config["workload"] == "closed-loop":
        last = -1
        for j, s in enumerate(steps):
            if s["step"] <= last:
                raise _Problem(
                    f"results.steps[{j}].step", f"must be > results.steps[{j - 1}].step ({last}), got {s['step']}"
                )
            last = s["step"]
        if last >= config["steps"]:
            raise _Problem(
                f"results.steps[{len(steps) - 1}].step", f"must be < config.steps ({config['steps']}), got {last}"
            )


def check_accepted_hist(h) -> dict:
    """A speculative run's acceptance, ``{"k": [steps that accepted 0, 1, .., k drafts], ...}`` per draft length
    ``k >= 1`` (a request's step: ``accepted_hist["3"][2]`` counts the steps that drafted 3 and accepted 2), at
    least one count > 0. Returns ``{k: [counts]}`` with int keys; raises ``ValueError`` saying what is wrong."""
    if not isinstance(h, Mapping) or not h:
        raise ValueError(f"must be a non-empty object of draft length -> counts, got {_show_typed(h)}")
    out = {}
    for key, v in h.items():
        try:
            k = int(key)
        except (TypeError, ValueError):
            k = None
        if k is None or k < 1 or str(k) != str(key):
            raise ValueError(f"keys must be draft lengths >= 1 (as strings), got {_show(key)}")
        if (
            not isinstance(v, (list, tuple))
            or len(v) != k + 1
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v)
        ):
            raise ValueError(
                f"[{_show(key)}]: must be {k + 1} integers >= 0 (steps accepting 0 .. {k}), got {_show(v)}"
            )
        out[k] = list(v)
    if not any(sum(v) for v in out.values()):
        raise ValueError("must count at least one step")
    return out


def _check_layer_events(ev) -> None:
    """``[[step, layer, stage, start_ms, end_ms], ...]`` (ms since the first timed step began)."""
    if not isinstance(ev, list):
        raise _Problem("results.layer_events", f"must be an array, got {_show_typed(ev)}")
    for j, e in enumerate(ev):
        w = f"results.layer_events[{j}]"
        if not isinstance(e, list) or len(e) != 5:
            raise _Problem(w, f"must be [step, layer, stage, start_ms, end_ms], got {_show(e)}")
        _int_field(f"{w}[0]", e[0], 0)
        _int_field(f"{w}[1]", e[1], 0)
        _str_field(f"{w}[2]", e[2])
        a = _number_field(f"{w}[3]", e[3], 0.0)
        b = _number_field(f"{w}[4]", e[4], 0.0)
        if b < a:
            raise _Problem(f"{w}[4]", f"must be >= start_ms ({show(e[3])}), got {show(e[4])}")


def _check_recording(trace: Trace) -> None:
    meta = trace.meta or {}
    if meta.get("kind") != KIND:
        raise _Problem(
            "meta.kind",
            f"must be {_show(KIND)} (this is a plain trace, not a recording), got {_show_typed(meta.get('kind'))}",
        )
    v = meta.get("recording_version")
    if isinstance(v, bool) or v != RECORDING_VERSION:
        raise _Problem(
            "meta.recording_version",
            f"must be {RECORDING_VERSION} (the version this loader reads), got {_show_typed(v)}",
        )
    if trace.config is None:
        raise _Problem("config", "missing required field")
    if trace.results is None:
        raise _Problem("results", "missing required field")
    _check_config(trace.config)
    _check_results(trace.results, trace.config)
    c = trace.config
    if c["workload"] == "closed-loop":
        if len(trace.requests) != c["concurrency"]:
            raise _Problem(
                "requests",
                f"must hold config.concurrency ({c['concurrency']}) requests for a "
                f"closed-loop recording, got {len(trace.requests)}",
            )
        bad = [i for i, q in enumerate(trace.requests) if q.prompt_tokens != c["context"]]
        if bad:
            raise _Problem(
                f"requests[{bad[0]}].prompt_tokens",
                f"must equal config.context ({c['context']}), got {trace.requests[bad[0]].prompt_tokens}",
            )


# ----------------------------------------------------------------------------------------------------------------
# The recording object


@dataclass(frozen=True)
class Recording:
    """A validated recording. ``source`` is the file it came from (None if built in memory); relative paths in it
    (``results.selection_file``) resolve against that file's directory."""

    trace: Trace
    source: Optional[str] = None

    @property
    def config(self) -> Dict[str, Any]:
        return self.trace.config

    @property
    def results(self) -> Dict[str, Any]:
        return self.trace.results

    @property
    def meta(self) -> Dict[str, Any]:
        return self.trace.meta

    @property
    def name(self) -> str:
        """Short label: the file name without ``.json``, else ``mode-ctx-conc[-fr]``."""
        if self.source:
            base = os.path.basename(self.source)
            return base[:-5] if base.endswith(".json") else base
        return label(self.config)

    def selection_path(self) -> Optional[str]:
        f = self.results.get("selection_file")
        if f is None:
            return None
        if os.path.isabs(f) or not self.source:
            return f
        return os.path.join(os.path.dirname(self.source), f)

    def step_durations_ms(self) -> list:
        """The sampled per-step durations (ms), in step order; empty if none were recorded."""
        return [1e3 * s["duration_s"] for s in self.results.get("steps") or ()]


def label(config: Mapping[str, Any]) -> str:
    """``lookahead-16k-c32-fr0.05`` style label of a configuration."""
    ctx = config["context"]
    c = f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)
    out = f"{config['mode']}-{c}-c{config['concurrency']}"
    if modes.get(config["mode"]).selects:
        out += f"-fr{config['fetch_ratio']:g}"
    return out


def closed_loop_requests(concurrency: int, context: int, output_tokens: int) -> tuple:
    """The bench workload: ``concurrency`` requests of ``context`` prompt tokens, all arriving at t = 0."""
    return tuple(
        TraceRequest(id=i, arrival_s=0.0, prompt_tokens=context, output_tokens=output_tokens)
        for i in range(concurrency)
    )


def build_recording(
    config: Mapping[str, Any],
    results: Mapping[str, Any],
    meta: Optional[Mapping] = None,
    requests: Optional[Sequence[TraceRequest]] = None,
    source: str = "<recording>",
) -> Recording:
    """Assemble and validate a recording. ``requests`` default to the closed-loop bench workload (config
    ``concurrency`` requests of ``context`` tokens decoding ``warmup_steps + steps`` tokens each).
    Raises ``RecordingError("<source>: <where>: ...")``."""
    m = {"kind": KIND, "recording_version": RECORDING_VERSION}
    m.update(meta or {})
    m["kind"], m["recording_version"] = KIND, RECORDING_VERSION
    config, results = dict(config), dict(results)
    try:
        _check_config(config)
        if requests is None:
            requests = closed_loop_requests(
                config["concurrency"], config["context"], config["warmup_steps"] + config["steps"]
            )
    except _Problem as p:
        raise RecordingError(f"{source}: {p.where}: {p.text}") from None
    try:
        trace = Trace(requests=tuple(requests), meta=m, config=config, results=results)
    except ValueError as e:  # Trace's own checks ("Trace.results.steps[0].step: ...")
        raise RecordingError(f"{source}: {str(e).removeprefix('Trace.')}") from None
    return _validated(trace, source)


def _validated(trace: Trace, source: str) -> Recording:
    try:
        _check_recording(trace)
    except _Problem as p:
        raise RecordingError(f"{source}: {p.where}: {p.text}") from None
    return Recording(trace, None if source == "<recording>" else source)


def parse_recording(obj, source: str = "<recording>") -> Recording:
    try:
        trace = parse_trace(obj, source)
    except TraceError as e:
        raise RecordingError(str(e)) from None
    return _validated(trace, source)


def load_recording(path: Union[str, PathLike]) -> Recording:
    """Read and validate the recording at ``path``; raises ``RecordingError`` (only), message starting with
    ``str(path)``. The selection file is not opened here (see :func:`load_selection`)."""
    try:
        trace = load_trace(path)
    except TraceError as e:
        raise RecordingError(str(e)) from None
    return _validated(trace, str(path))


def save_recording(rec: Recording, path: Union[str, PathLike]) -> None:
    """Byte-stable, as ``save_trace``."""
    text = dumps_trace(rec.trace)
    d = os.path.dirname(str(path))
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def find_recordings(directory: Union[str, PathLike]) -> list:
    """Paths of ``*.json`` files under ``directory`` (sorted, recursive); none if it does not exist."""
    out = []
    if not os.path.isdir(directory):
        return out
    for root, _dirs, files in os.walk(directory):
        out += [os.path.join(root, f) for f in files if f.endswith(".json")]
    return sorted(out)


# ----------------------------------------------------------------------------------------------------------------
# Selected block sets beside the recording (compressed .npz)


def save_selection(path: Union[str, PathLike], sets, layers: Sequence[int], request: int = 0) -> None:
    """Write recorded predicted block sets: ``sets[steps + 1, rows, K]`` (-1 padded; index 0 = the first fill,
    index i = the set planned during timed step i - 1), rows = ``len(layers) × kv_heads`` of request ``request``,
    layer-major. Stored as int16 when the ids fit, else int32, with ``np.savez_compressed``."""
    a = np.asarray(sets)
    if a.ndim != 3 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"save_selection: sets must be an integer array [steps, rows, K], got {a.dtype} {a.shape}")
    dt = np.int16 if a.size == 0 or int(a.max()) < 2**15 else np.int32
    np.savez_compressed(
        path, sets=a.astype(dt), layers=np.asarray(layers, dtype=np.int32), request=np.asarray(request, dtype=np.int32)
    )


def read_npz(path, error=ValueError) -> dict:
    """Every array of the ``.npz`` at ``path`` (no pickles); an unreadable or non-npz file raises ``error`` with one
    line naming the path (the selection files of both backends read through this)."""
    import zipfile
    import zlib

    try:
        z = np.load(path, allow_pickle=False)
    except OSError as e:  # missing, a folder, unreadable
        raise error(f"{path}: cannot read: {e.strerror or ' '.join(str(e).split())}") from None
    except (ValueError, EOFError, zipfile.BadZipFile) as e:  # empty, not a zip, a broken zip
        raise error(f"{path}: not a numpy .npz file ({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise error(f"{path}: not a numpy .npz file (a single .npy array)")
    try:
        with z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error, NotImplementedError) as e:
        # a member cut short, its checksum or compressed stream broken, its header not an array's
        raise error(f"{path}: a corrupt .npz file ({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None


def load_selection(path: Union[str, PathLike], top_k: Optional[int] = None):
    """``(sets[steps, rows, K] int64, layers[P] int64)``; raises ``RecordingError("<path>: <key>: ...")``."""
    source = str(path)
    data = read_npz(path, RecordingError)
    for k in ("sets", "layers"):
        if k not in data:
            raise RecordingError(f"{source}: {k}: missing required array")
    sets, layers = data["sets"], data["layers"]
    if sets.ndim != 3 or not np.issubdtype(sets.dtype, np.integer) or sets.shape[0] < 2:
        raise RecordingError(
            f"{source}: sets: must be an integer array [steps >= 2, rows, top_k], got {sets.dtype} {list(sets.shape)}"
        )
    if top_k is not None and sets.shape[2] != top_k:
        raise RecordingError(f"{source}: sets: must have top_k = {top_k} columns, got {sets.shape[2]}")
    if int(sets.min(initial=0)) < -1:
        raise RecordingError(f"{source}: sets: block ids must be >= -1, got {int(sets.min())}")
    if layers.ndim != 1 or not layers.size or sets.shape[1] % layers.size:
        raise RecordingError(
            f"{source}: layers: must be a 1-d array dividing the {sets.shape[1]} rows, got {list(layers.shape)}"
        )
    return sets.astype(np.int64), layers.astype(np.int64)
