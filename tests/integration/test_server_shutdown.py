"""SIGTERM: running requests get the grace period, then an explicit OpenAI-style error; never a cut connection."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

pytest.importorskip("fastapi")
import httpx
from server_proc import TINY, ServerProcess

LONG = 1000  # tokens: about 8 s on the CPU, far past the grace period


def _server(grace_s: float) -> ServerProcess:
    return ServerProcess(*TINY, "--max-context", "1024", "--dtype", "float32", "--shutdown-grace-s", str(grace_s))


def _wait_running(srv: ServerProcess, n: int) -> None:
    deadline = time.monotonic() + 20
    while srv.metrics().get("oasis_num_requests_running", 0) < n:
        assert time.monotonic() < deadline, "the requests never ran"
        time.sleep(0.02)


def test_sigterm_ends_running_requests_with_errors_after_the_grace_period():
    srv = _server(0.5)
    try:
        body = {"model": "tiny", "prompt": "abc", "max_tokens": LONG}
        plain: dict = {}
        t = threading.Thread(
            target=lambda: plain.setdefault("r", httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60))
        )
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            t.start()
            _wait_running(srv, 2)
            srv.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        t.join(60)
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][len("data: ") :])["error"]
        assert err["code"] == "server_shutting_down" and "grace period" in err["message"]
        assert plain["r"].status_code == 503
        assert plain["r"].json()["error"]["code"] == "server_shutting_down"
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
        assert "Traceback" not in srv.logs()
    finally:
        srv.stop()


def test_a_request_that_finishes_within_the_grace_period_completes():
    srv = _server(30)
    try:
        got: dict = {}
        t = threading.Thread(
            target=lambda: got.setdefault(
                "r",
                httpx.post(
                    f"{srv.base_url}/v1/completions",
                    json={"model": "tiny", "prompt": "abc", "max_tokens": 150},
                    timeout=60,
                ),
            )
        )
        t.start()
        _wait_running(srv, 1)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert got["r"].status_code == 200, got["r"].text
        assert got["r"].json()["choices"][0]["finish_reason"] == "length"
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
        with pytest.raises(httpx.ConnectError):  # it is gone, and took no new work on the way out
            httpx.get(f"{srv.base_url}/health", timeout=5)
    finally:
        srv.stop()
