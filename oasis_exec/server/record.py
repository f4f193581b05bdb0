"""`serve --record FILE`: log what the server served and, when it shuts down, write it as a recording.

The event loop logs every accepted request that ends (arrival, prompt length, tokens, first and last token times,
finish reason); the engine thread logs every engine step (duration, requests running). At shutdown -- after the
engine thread has stopped, so reading the engine from the event loop thread is safe -- `write()` adds the engine's
cumulative counters and hands everything to `recording.write_serve_recording` (the format, and which
requests are kept, are described there and in traces/SCHEMA.md).
"""

from __future__ import annotations

import datetime
import logging
import math
import platform
import sys
import time

log = logging.getLogger("oasis_exec.server")


class ServeLog:
    def __init__(self, path: str, engine, *, hardware: str, server: dict | None = None) -> None:
        self.path = path
        self.engine = engine  # adapter.ExecutorEngine
        self.hardware = hardware
        self.server = dict(server or {})
        self.t0 = time.monotonic()
        self.requests: list[dict] = []  # event loop thread only
        self.step_ms: list[float] = []  # engine thread only (until it has stopped)
        self.max_running = 0

    def start(self) -> None:
        self.t0 = time.monotonic()

    def on_step(self, duration_s: float, running: int) -> None:
        self.step_ms.append(1e3 * duration_s)
        self.max_running = max(self.max_running, running)

    def on_end(self, stream, finish_reason: str, now: float) -> None:
        n = stream.n_tokens
        first, last = stream.first_token_at, stream.last_token_at
        self.requests.append(
            {
                "id": stream.id,
                "arrival_s": stream.arrival - self.t0,
                "prompt_tokens": stream.prompt_len,
                "output_tokens": n,
                "finish_reason": finish_reason,
                "ttft_ms": 1e3 * (first - stream.arrival) if first is not None else None,
                "tpot_ms": 1e3 * (last - first) / (n - 1) if n > 1 else None,
                "finish_s": (last if last is not None else now) - self.t0,
            }
        )

    def serve_record(self) -> dict:
        """The dict `recording_from_serve` reads; call once the engine thread has stopped."""
        eng = self.engine.engine
        cfg = eng.cfg
        s = eng.stats()
        if cfg.device == "cuda":
            import torch

            device = torch.cuda.get_device_name()
        else:
            device = platform.processor() or "cpu"
        from oasis_core.provenance import commit

        hidden = s.hidden_fraction
        shape = eng.runner.shape
        return {
            "layer_windows": list(shape.layer_windows) if shape.is_hybrid else None,  # a hybrid model's kinds
            "requests": list(self.requests),
            "step_ms": list(self.step_ms),
            "max_running": self.max_running,
            "max_lanes": eng.max_lanes,
            "decode_steps": eng.runner.decode_steps,
            "prefetch_bytes": int(s.prefetch_bytes),
            "stage_ms": dict(s.stage_ms),
            "hidden_fraction": None if math.isnan(hidden) else hidden,
            "device": device,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(),
            "server": self.server,
        }

    def write(self) -> None:
        """Write the recording; a failure is logged (an error with its traceback), never raised (we are shutting down)."""
        from .recording import write_serve_recording

        try:
            rec = write_serve_recording(self.path, self.serve_record(), self.engine.engine.cfg, hardware=self.hardware)
        except Exception:
            log.exception("--record: no recording written to %s", self.path)
            return
        # the serve CLI's own notice (stderr, at any log level), not a log record
        print(f"wrote recording {self.path} ({len(rec.trace.requests)} requests)", file=sys.stderr, flush=True)
