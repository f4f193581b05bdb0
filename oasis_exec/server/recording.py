"""The recording of a serving run (``python -m oasis_exec serve --record FILE``): the served requests as an
open-loop ``trace`` workload and what was measured, in the format of ``traces/SCHEMA.md`` ("Recordings"), which
``oasis-sim replay`` reads. ``record.ServeLog`` collects what it needs while the server runs. Torch-free."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from oasis_core import modes
from oasis_core.recording import Recording, build_recording, save_recording
from oasis_core.recording_parts import TRANSFER_NAMES, config_fields, hardware_of, sample_steps
from oasis_core.trace import TraceRequest


def _pct_linear(xs, q):
    """numpy's linear-interpolation percentile, as ``oasis_sim.metrics`` reads a simulated run."""
    return float(np.percentile(xs, q)) if len(xs) else None


def recording_from_serve(
    serve: Mapping[str, Any],
    exec_config=None,
    *,
    hardware: Optional[str] = None,
    model: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    source: str = "<recording>",
) -> Recording:
    """Recording of what a server served (``config.workload = "trace"``). ``serve`` holds ``requests`` (every
    accepted request that ended: ``id, arrival_s`` (since the server started), ``prompt_tokens, output_tokens``
    (generated), ``ttft_ms, tpot_ms, finish_s, finish_reason``), ``step_ms`` (every engine step), ``max_running``,
    ``max_lanes``, ``decode_steps``, ``prefetch_bytes``, ``stage_ms`` (cumulative, profiled runs only),
    ``hidden_fraction``, ``device``, ``date``, ``commit``, ``server`` (its options) and, for a hybrid model,
    ``layer_windows`` (per layer: None = full attention, else its window; into ``config``, which the replay checks
    against its model preset).

    Requests that ended before producing a token (aborted or failed while queued or in prefill) are **excluded**
    from the workload and counted in ``results.requests_dropped`` (finish reason -> count); a request aborted or
    failed after producing tokens is kept with the tokens it produced, and ``results.request_finish_reasons``
    (parallel to ``requests``) says how each ended (``length``, ``stop``, ``abort``, ``error``). Measured metrics
    use the simulator's definitions over the kept requests: TTFT = first token - arrival, TPOT = (last token -
    first token) / (tokens - 1), percentiles by linear interpolation, throughput = tokens / (last token - first
    arrival). Per-step figures (stages, bytes, stall) are per decode step (``decode_steps``; the executor runs
    prefill and decode in separate steps); ``config.steps`` counts every engine step."""
    c = config_fields(exec_config)
    s = dict(serve)
    device = str(s.get("device") or "unknown")
    hw = hardware_of("recording_from_serve", hardware, device)
    kept, dropped = _kept(s.get("requests") or ())
    requests = tuple(
        TraceRequest(
            id=int(q["id"]),
            arrival_s=round(max(q["arrival_s"], 0.0), 6),
            prompt_tokens=int(q["prompt_tokens"]),
            output_tokens=int(q["output_tokens"]),
        )
        for q in kept
    )
    step_ms = [float(x) for x in s.get("step_ms") or ()]
    steps = max(len(step_ms), 1)
    per = int(s.get("decode_steps") or 0) or steps  # per-step figures: per decode step
    config = _serve_config(s, c, model, hw, requests, steps)
    results = _serve_results(s, kept, dropped, requests, device, modes.get(config["mode"]).sparse, per)
    if step_ms:
        results["steps"] = sample_steps(step_ms)
        results["steps_sampled_of"] = len(step_ms)
    m = {"recorder": "oasis_exec.recorder (serve)"}
    m.update(meta or {})
    return build_recording(config, results, meta=m, requests=requests, source=source)


def _kept(ended) -> tuple[list, dict]:
    """The requests that produced a token (by arrival, then id), and the others' count by finish reason."""
    ended = list(ended)
    kept = sorted((q for q in ended if q["output_tokens"] >= 1), key=lambda q: (round(q["arrival_s"], 6), q["id"]))
    if not kept:
        raise ValueError("recording_from_serve: requests: no served request produced a token, nothing to record")
    dropped = {}
    for q in ended:
        if q["output_tokens"] < 1:
            dropped[q["finish_reason"]] = dropped.get(q["finish_reason"], 0) + 1
    return kept, dropped


def _serve_config(s, c, model, hw, requests, steps) -> dict:
    """A serving recording's ``config``: the run's options (``c``: the executor's fields) and what it served."""
    mode = c.get("mode", "lookahead")
    sparse = modes.get(mode).sparse
    transfer_raw = c.get("transfer") or "host"
    config = {
        "mode": mode,
        "model": model or c.get("model"),
        "hardware": hw,
        "workload": "trace",
        "context": max(q.prompt_tokens for q in requests),
        "concurrency": max(int(s.get("max_running") or 1), 1),
        "max_lanes": s.get("max_lanes"),
        "kv_budget_gb": c.get("kv_budget_gb"),
        "host_kv_gb": c.get("host_kv_gb"),
        "top_k": int(c.get("top_k", 128)),
        "block_size": int(c.get("block_size", 16)),
        "fetch_ratio": float(c.get("fetch_ratio", 0.05)),
        "transfer_path": TRANSFER_NAMES.get(transfer_raw, transfer_raw) if sparse else None,
        "exec_transfer": transfer_raw if sparse else None,
        "selection": c.get("selection", "model"),
        "seed": int(c.get("seed", 0)),
        "warmup_steps": 0,
        "steps": steps,
        "prefill_chunk": c.get("prefill_chunk"),
        "no_transfer": bool(c.get("no_transfer", False)),
        "dummy_weights": c.get("model_path") is None,
        "profile": bool(c.get("profile", False)),
        "synthetic": c.get("synthetic"),
        "fetch_policy": c.get("fetch_policy"),
        "hot_slots": c.get("hot_slots"),
        "host_kv_dtype": c.get("host_kv_dtype", "auto") if sparse else None,
        "exec_config": c,
        "server": dict(s.get("server") or {}),
    }
    if s.get("layer_windows") is not None:
        config["layer_windows"] = list(s["layer_windows"])
    return config


def _serve_results(s, kept, dropped, requests, device, sparse, per) -> dict:
    """A serving recording's measured ``results`` (the simulator's metric definitions, see recording_from_serve;
    ``per``: the steps per-step figures divide by)."""
    stages = {k: float(v) / per for k, v in (s.get("stage_ms") or {}).items()}
    ttft = [float(q["ttft_ms"]) for q in kept]
    tpot = [float(q["tpot_ms"]) for q in kept if q["output_tokens"] > 1 and q.get("tpot_ms") is not None]
    span_s = max(q["finish_s"] for q in kept) - min(q["arrival_s"] for q in kept)
    tokens = sum(q.output_tokens for q in requests)
    total_bytes = int(s.get("prefetch_bytes") or 0)
    stall = stages.get("stall")
    hidden = s.get("hidden_fraction")
    return {
        "tpot_ms_p50": _pct_linear(tpot, 50) if tpot else 0.0,
        "tpot_ms_p99": _pct_linear(tpot, 99) if tpot else 0.0,
        "throughput_tok_s": tokens / span_s if span_s > 0 else 0.0,
        "ttft_ms_p50": _pct_linear(ttft, 50),
        "ttft_ms_p99": _pct_linear(ttft, 99),
        "stage_ms_per_step": stages,
        "bytes_per_step": {"pcie_h2d": total_bytes / per},
        "link_bytes": {"pcie_h2d": total_bytes},
        "stall_ms_per_step": stall if stall is not None else (0.0 if not sparse else None),
        "hidden_fraction": None if hidden is None or hidden != hidden else float(hidden),  # NaN: not measured
        "device": device,
        "date": str(s.get("date") or "unknown"),
        "commit": str(s.get("commit") or "unknown"),
        "decode_steps": per,
        "requests_served": len(kept),
        "requests_dropped": dropped,
        "output_tokens": tokens,
        "wall_s": span_s,
        "request_finish_reasons": [q["finish_reason"] for q in kept],
    }


def write_serve_recording(path: str, serve: Mapping[str, Any], exec_config=None, **kw) -> Recording:
    """Save the recording of a serving run at ``path`` (see :func:`recording_from_serve`)."""
    rec = recording_from_serve(serve, exec_config, source=path, **kw)
    save_recording(rec, path)
    return rec
