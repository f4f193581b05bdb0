"""experiments/device.sh, the one device runner, on the CPU: step names checked (exit 2, one line), the steps
listed, the device record, and the real model assembled from its pieces in name order with its sha256 checked."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "experiments" / "device.sh"


def _run(*args, **env):
    full = dict(os.environ, PY=sys.executable, **env)
    return subprocess.run(["bash", str(RUNNER), *args], capture_output=True, text=True, env=full, timeout=120)


def test_bad_step_names_exit_2_with_one_line():
    for args in ((), ("nope/missing",), ("../x/y",), ("headline",)):
        r = _run(*args, OUT="/tmp/oasis-device-test-unused")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_list_names_every_step_file():
    r = _run("--list")
    assert r.returncode == 0
    files = sorted(f"{p.parent.parent.name}/{p.stem}" for p in (REPO / "experiments").glob("*/steps/*.sh"))
    assert files and r.stdout.split() == files


def test_info_records_the_commit_and_the_step(tmp_path):
    r = _run("info", OUT=str(tmp_path), OASIS_COMMIT="abc1234")
    assert r.returncode == 0, r.stderr
    rec = (tmp_path / "device.txt").read_text().splitlines()
    assert rec[0].startswith("step info") and "commit abc1234" in rec and any(x.startswith("torch ") for x in rec)


def test_model_is_assembled_in_piece_order_and_checked(tmp_path):
    pieces = {"p_ab": b"second-", "p_aa": b"first-", "p_ac": b"third"}
    mdir = tmp_path / "m"
    mdir.mkdir()
    for name, data in pieces.items():
        (mdir / name).write_bytes(data)
    whole = b"first-second-third"
    good = hashlib.sha256(whole).hexdigest()
    r = _run("model", OUT=str(tmp_path / "out"), MODEL_DIR=str(mdir), MODEL_SHA256=good, CARRIED=str(tmp_path / "none"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (mdir / "model.gguf").read_bytes() == whole
    assert r.stdout.strip().splitlines()[-1] == str(mdir / "model.gguf")
    # a wrong checksum (e.g. a piece missing): refused, and the bad file is not left for the next call
    (mdir / "model.gguf").unlink()
    (mdir / "p_ab").unlink()
    r = _run("model", OUT=str(tmp_path / "out"), MODEL_DIR=str(mdir), MODEL_SHA256=good, CARRIED=str(tmp_path / "none"))
    assert r.returncode == 1 and "sha256" in r.stdout
    assert not (mdir / "model.gguf").exists()
