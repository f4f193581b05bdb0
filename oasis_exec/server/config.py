"""`ServerConfig`: the server's own options (not the engine's), validated, with the help text its CLI is built from.

Every field carries `metadata={"help": ...}` (and `"choices"` where the values are a closed set); `cli.py` turns
each field into a `--kebab-case` flag of `python -m oasis_exec serve`: a bool becomes a switch, a tuple a flag taking
one or more values. The engine's options come from `oasis_exec.config.ExecConfig` (`adapter.add_engine_args`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from oasis_core.echo import show

LOG_LEVELS = ("debug", "info", "warning", "error")
SCORE_ATTENTION = ("served", "dense")  # server/scoring.py
MiB = 1 << 20


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    host: str = _opt("127.0.0.1", "address to bind")
    port: int = _opt(8000, "TCP port; 0 picks a free one")
    served_model_name: str | None = _opt(
        None, "name clients send as `model` (default: the --model preset, or a real model's file stem or folder name)"
    )
    max_waiting: int = _opt(
        256, "requests accepted but not yet running, at most (>= 1); beyond it the server answers 429"
    )
    max_body_bytes: int = _opt(16 * MiB, "largest request body accepted, in bytes; a larger one is answered 413")
    api_key: str | None = _opt(
        None, "require `Authorization: Bearer KEY` on /v1/* (401 otherwise); /health and /metrics stay open"
    )
    allowed_hosts: tuple[str, ...] = _opt(
        (), "accept only requests whose Host header is one of these (`*.example.com` allowed); default: any"
    )
    cors_origins: tuple[str, ...] = _opt(
        (), "origins allowed to call the API from a browser (`*` for any); default: no CORS headers"
    )
    cors_methods: tuple[str, ...] = _opt(("GET", "POST"), "HTTP methods allowed in cross-origin requests")
    cors_headers: tuple[str, ...] = _opt(
        ("Authorization", "Content-Type"), "request headers allowed in cross-origin requests (`*` for any)"
    )
    cors_allow_credentials: bool = _opt(False, "allow cookies / credentials in cross-origin requests")
    shutdown_grace_s: float = _opt(
        10.0, "on SIGTERM / SIGINT, seconds running requests may take to finish; then each ends with an error"
    )
    stall_timeout_s: float = _opt(
        60.0, "/health reports the engine stalled (503) when no step has finished for this long while work waits"
    )
    score_attention: str = _opt(
        "served",
        "attention that scores a prompt (`echo` with `logprobs`): `served` = the served mode's (in a sparse mode, "
        "teacher-forced decode of the prompt's tokens), `dense` = the dense reference in every mode",
        choices=SCORE_ATTENTION,
    )
    score_prefill_tokens: int = _opt(
        1,
        "in a sparse mode with --score-attention served, a scored prompt's first N tokens are prefilled (dense, as "
        "a served prompt is) and every later one is scored by a decode step of the mode",
        metavar="N",
    )
    log_level: str = _opt("warning", "log level", choices=LOG_LEVELS)
    record: str | None = _opt(
        None,
        "at shutdown, write what was served as a recording (traces/SCHEMA.md, workload \"trace\") for "
        "`python -m oasis_sim replay|validate`",
        metavar="FILE",
    )
    chat_template: str | None = _opt(
        None,
        "a Jinja chat template file for /v1/chat/completions, replacing the model's own (a model without one, such as "
        "a base model, otherwise answers chat requests with 400)",
        metavar="FILE",
    )
    record_hardware: str | None = _opt(
        None, "simulator hardware preset of the recording (default: told from the GPU's name)", metavar="PRESET"
    )

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name}: {why}, got {show(getattr(self, name))}")

        if not self.host:
            raise bad("host", "must not be empty")
        if not 0 <= self.port <= 65535:
            raise bad("port", "must be in [0, 65535]")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise bad("served_model_name", "must not be empty")
        if self.max_waiting < 1:  # 0 would answer 429 to every request of an idle server
            raise bad("max_waiting", "must be >= 1 (a request waits before its first step, even on an idle server)")
        if self.max_body_bytes < 1:
            raise bad("max_body_bytes", "must be >= 1")
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise bad("api_key", "must be non-empty and hold no whitespace")
        for name in ("allowed_hosts", "cors_origins", "cors_methods", "cors_headers"):
            values = getattr(self, name)
            if not isinstance(values, tuple) or any(not isinstance(v, str) or not v.strip() for v in values):
                raise bad(name, "must be a tuple of non-empty strings")
        for name in ("shutdown_grace_s", "stall_timeout_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0 or (name == "stall_timeout_s" and v == 0):
                raise bad(name, "must be finite and " + (">= 0" if name == "shutdown_grace_s" else "> 0"))
        if self.score_attention not in SCORE_ATTENTION:
            raise bad("score_attention", f"must be one of {', '.join(SCORE_ATTENTION)}")
        if self.score_prefill_tokens < 1:
            raise bad("score_prefill_tokens", "must be >= 1")
        if self.log_level not in LOG_LEVELS:
            raise bad("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        if self.record_hardware is not None and self.record is None:
            raise bad("record_hardware", "needs --record")
        if self.record_hardware is not None:
            from oasis_core.specs import HARDWARE

            if self.record_hardware not in HARDWARE:
                raise bad("record_hardware", f"must be one of {', '.join(sorted(HARDWARE))}")


FIELDS = tuple(dataclasses.fields(ServerConfig))
