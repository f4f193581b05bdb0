"""Ctrl-C on ``python -m oasis_exec serve`` (issue 35, newcomer): while the model loads or once the server is up,
the command ends with one line (``interrupted``) and status 130 -- at 7e01859 uvicorn's re-raised SIGINT printed
two chained tracebacks."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "oasis_exec", "serve", "--model", "tiny", "--dummy", "--device", "cpu", "--port", "0"]


def _start():
    # SIGINT back to its default in the child: a shell's background job (CI) may have it ignored, and exec keeps that
    return subprocess.Popen(
        SERVE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt(p) -> tuple[int, str]:
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("serve did not end within 60 s of SIGINT")
    return p.returncode, err.decode(errors="replace")


def test_ctrl_c_on_a_running_server_is_one_line():
    p = _start()
    line = p.stdout.readline().decode()  # the listening line: the server is up
    assert line.startswith("OASIS_SERVER_LISTENING"), line
    rc, err = _interrupt(p)
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted"


def test_ctrl_c_while_loading_is_one_line():
    p = _start()
    time.sleep(1.5)  # importing torch, building the engine
    rc, err = _interrupt(p)
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip() == "interrupted"
