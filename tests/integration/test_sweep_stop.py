"""Issue 35, class 2: a sweep is bounded (points counted before any is built) and stoppable (SIGINT/SIGTERM cancel
the queued points, stop the workers, write the rows that finished and exit 128 + signal within seconds), in the
local pool and on Ray. The parent killed outright leaves no worker behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from oasis_sim.cli import main
from oasis_sim.sweep import MAX_POINTS

REPO = Path(__file__).resolve().parents[2]
TINY = "policy_layers: 1, profile_steps: 4, timeline_steps: 0, mode: lookahead"


def test_a_grid_too_large_is_refused_before_it_is_built(tmp_path, capsys):
    """10^10 points: refused at once, naming the count and the limit (7e01859 built the product: no exit)."""
    axes = "\n".join(f"  {k}: [{', '.join(str(i) for i in range(1, 11))}]" for k in ("top_k", "seed", "block_size"))
    axes += "\n" + "\n".join(
        f"  synthetic.{k}: [{', '.join(str(i / 100) for i in range(10))}]"
        for k in (
            "drift_rate",
            "hot_fraction",
            "drift_zone",
            "window_fraction",
            "head_share",
            "draft_error_rate",
            "proxy_error_rate",
        )
    )
    g = tmp_path / "g.yaml"
    g.write_text(f"base: {{{TINY}}}\ngrid:\n{axes}\n")
    t0 = time.monotonic()
    assert main(["sweep", str(g), "--out", str(tmp_path / "o")]) == 2
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert "10,000,000,000 points" in err and f"{MAX_POINTS:,}" in err, err
    assert not (tmp_path / "o" / "sweep.csv").exists()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _grid(tmp_path) -> Path:
    """Two points that end in a second, then four that run for minutes (the bundled trace, the policy run exactly
    at every step of every layer)."""
    g = tmp_path / "g.yaml"
    g.write_text(
        "base: {mode: lookahead, timeline_steps: 0, policy_sampling: exact}\n"
        "grid:\n  max_requests: [1, 1, 200, 200, 200, 200]\n"
    )
    return g


def _start(tmp_path, extra):
    out = tmp_path / "out"
    p = subprocess.Popen(
        [sys.executable, "-m", "oasis_sim", "sweep", str(_grid(tmp_path)), "--out", str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"},
    )
    # the progress bar (redrawn at every point) says when the two quick points are done
    seen = b""
    deadline = time.monotonic() + 240
    os.set_blocking(p.stderr.fileno(), False)
    while b"2/6" not in seen:
        assert time.monotonic() < deadline and p.poll() is None, seen.decode(errors="replace")[-2000:]
        chunk = p.stderr.read()
        seen += chunk or b""
        time.sleep(0.05)
    return p, out


def _stop_and_check(p, out, signum, limit_s):
    kids = _children(p.pid)
    t0 = time.monotonic()
    p.send_signal(signum)
    try:
        p.wait(timeout=limit_s + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"the sweep did not stop within {limit_s + 30} s of {signal.Signals(signum).name}")
    took = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    assert p.returncode == 128 + signum, err[-2000:]
    assert took < limit_s, f"{took:.1f} s"
    assert f"stopped by {signal.Signals(signum).name}" in err and "2 of 6 points run" in err, err[-1000:]
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not [k for k in kids if _alive(k)], "workers left running"
    df = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    assert df["error"].tolist()[:2] == ["", ""]
    assert all(e.startswith("not run: the sweep was stopped") for e in df["error"].tolist()[2:])
    assert len(df) == 6


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_local_pool_stops_on_a_signal(tmp_path, signum):
    p, out = _start(tmp_path, ["--workers", "2"])
    _stop_and_check(p, out, signum, limit_s=3)


def test_one_worker_stops_on_sigterm(tmp_path):
    p, out = _start(tmp_path, ["--workers", "1"])
    _stop_and_check(p, out, signal.SIGTERM, limit_s=3)


def test_workers_die_with_a_killed_parent(tmp_path):
    p, _ = _start(tmp_path, ["--workers", "2"])
    kids = _children(p.pid)
    assert kids
    p.kill()
    p.wait()
    deadline = time.monotonic() + 5
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)], "workers orphaned"


def test_ray_sweep_stops_on_sigterm(tmp_path):
    pytest.importorskip("ray")
    p, out = _start(tmp_path, ["--workers", "2", "--ray", "local"])
    _stop_and_check(p, out, signal.SIGTERM, limit_s=15)
