"""/health: recovery after a failed step, and a stalled engine (in-process server, fake engine)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fakes import FakeEngine, serve_app

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.tokenizer import ByteTokenizer


def _health_until(url: str, want: str, timeout_s: float = 15.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{url}/health", timeout=10)
        if r.json()["status"] == want:
            return r
        assert time.monotonic() < deadline, f"/health never became {want!r}: {r.json()}"
        time.sleep(0.05)


def _complete(url: str, max_tokens: int = 3) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions", json={"model": "fake", "prompt": [1, 2], "max_tokens": max_tokens}, timeout=30
    )


def test_health_recovers_once_the_engine_checks_healthy():
    eng = FakeEngine(step_s=0, fail_steps=(1,), checkable=True)
    eng.broken = True
    with serve_app(create_app(eng, ByteTokenizer(), ServerConfig())) as url:
        r = _complete(url)
        assert r.status_code == 500 and "injected failure" in r.json()["error"]["message"]
        r = httpx.get(f"{url}/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "unhealthy" and "injected failure" in r.json()["reason"]
        for _ in range(3):  # the probe runs while idle and fails: still unhealthy
            time.sleep(0.6)
            assert httpx.get(f"{url}/health", timeout=10).status_code == 503
        eng.broken = False
        assert _health_until(url, "ok").status_code == 200
        assert _complete(url).status_code == 200


def test_health_recovers_after_a_successful_step_without_a_check():
    with serve_app(create_app(FakeEngine(step_s=0, fail_steps=(1,)), ByteTokenizer(), ServerConfig())) as url:
        assert _complete(url).status_code == 500
        assert httpx.get(f"{url}/health", timeout=10).status_code == 503
        assert _complete(url).status_code == 200
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}


class ManualClock:
    """The seconds /health's stall rule reads, advanced by the test alone: no wall-time race on a loaded machine."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_hung_step_is_reported_stalled_then_ok_when_it_moves():
    eng = FakeEngine(step_s=0)
    eng.gate = threading.Event()
    clock = ManualClock()
    app = create_app(eng, ByteTokenizer(), ServerConfig(stall_timeout_s=5.0), clock=clock)
    with serve_app(app) as url:
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}  # idle: never stalled
        clock.t += 60
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}  # idle for long: still not stalled
        done = {}
        sender = threading.Thread(target=lambda: done.setdefault("r", _complete(url)))
        sender.start()
        try:
            assert eng.entered.wait(30), "the engine never began a step"
            r = httpx.get(f"{url}/health", timeout=10)  # hung, but for less than the timeout on the clock
            assert r.status_code == 200 and r.json() == {"status": "ok"}
            clock.t += 5.5
            r = httpx.get(f"{url}/health", timeout=10)
            assert r.status_code == 503 and r.json()["status"] == "stalled"
            assert "no engine progress for 5.5 s" in r.json()["reason"]
            m = httpx.get(f"{url}/metrics", timeout=10).text
            assert "oasis_engine_healthy 0.0" in m
        finally:
            eng.gate.set()
            sender.join(30)
        assert done["r"].status_code == 200
        assert _health_until(url, "ok").status_code == 200
