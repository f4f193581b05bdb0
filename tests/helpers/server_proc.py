"""Start `python -m oasis_exec.server` in a subprocess on a free port and wait until it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
IDLE_ZERO = (
    "oasis_num_requests_running",
    "oasis_num_requests_waiting",
    "oasis_gpu_slots_used",
    "oasis_host_blocks_used",
)
TINY = ["--model", "tiny", "--dummy", "--device", "cpu"]


class ServerProcess:
    def __init__(self, *args: str, start_timeout_s: float = 60.0) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="oasis-server-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "oasis_exec.server", *args, "--port", "0", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.base_url = self._wait_listening(start_timeout_s)
        self._wait_healthy(start_timeout_s)

    def _wait_listening(self, timeout_s: float) -> str:
        found: list[str] = []

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith("OASIS_SERVER_LISTENING "):
                    found.append(line.split()[1])
                    break
            for _ in self.proc.stdout:  # keep draining so the server never blocks on a full pipe
                pass

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start (rc={self.proc.returncode}):\n{self.logs()}")
            time.sleep(0.05)
        return found[0]

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server never became healthy:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def metrics(self) -> dict[str, float]:
        """`oasis_*` samples of /metrics, keyed by name with labels: `oasis_requests_total{outcome="length"}`."""
        out = {}
        for line in httpx.get(f"{self.base_url}/metrics", timeout=10).text.splitlines():
            if line.startswith("oasis_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def wait_idle(self, timeout_s: float = 20.0) -> dict[str, float]:
        """Poll /metrics until nothing runs, waits or holds GPU slots / host blocks; return the last sample."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            busy = [k for k in IDLE_ZERO if m.get(k, 0) != 0]
            if not busy:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout_s} s: {[(k, m[k]) for k in busy]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
