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


def _carry_repo(tmp_path):
    """A scratch git repository with device_carry.sh and device.sh under experiments/, a result and a source file."""
    repo = tmp_path / "repo"
    (repo / "experiments" / "q" / "results").mkdir(parents=True)
    for name in ("device_carry.sh", "device.sh"):
        (repo / "experiments" / name).write_bytes((REPO / "experiments" / name).read_bytes())
    (repo / "experiments" / "q" / "results" / "r.json").write_text("{}")
    (repo / "src.py").write_text("x = 1\n")

    def git(*a):
        return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return repo, git


def test_carry_slims_the_tree_and_puts_it_back(tmp_path):
    """``device_carry.sh slim`` untracks the results (a device call carries the tree), ``unslim`` restores the index
    and the exclude file exactly; slim twice or unslim unslimmed is refused."""
    repo, git = _carry_repo(tmp_path)
    carry = ["bash", str(repo / "experiments" / "device_carry.sh")]
    assert subprocess.run([*carry, "slim"], capture_output=True, text=True).returncode == 0
    assert "experiments/q/results/r.json" not in git("ls-files") and "src.py" in git("ls-files")
    assert git("status", "--short", "--untracked-files=all").strip().startswith("D ")  # ignored, not untracked
    assert subprocess.run([*carry, "slim"], capture_output=True, text=True).returncode == 1
    assert subprocess.run([*carry, "unslim"], capture_output=True, text=True).returncode == 0
    assert git("status", "--short") == ""
    assert subprocess.run([*carry, "unslim"], capture_output=True, text=True).returncode == 1


def test_carry_pieces_reassemble_on_the_device_runner(tmp_path):
    """``device_carry.sh pieces gemma`` splits the GGUF into one folder a piece under .models/ (ignored by git);
    device.sh's ``model`` step, carrying them, puts them back together and checks the sha256."""
    repo, git = _carry_repo(tmp_path)
    gguf = tmp_path / "g.gguf"
    gguf.write_bytes(b"0123456789abc")
    env = dict(os.environ, GEMMA_GGUF=str(gguf), PIECE="4")
    r = subprocess.run(
        ["bash", str(repo / "experiments" / "device_carry.sh"), "pieces", "gemma"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.parent.name + "/" + p.name for p in (repo / ".models").glob("*/p_*")) == [
        "a/p_aa",
        "b/p_ab",
        "c/p_ac",
        "d/p_ad",
    ]
    assert git("status", "--short") == ""
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    out = subprocess.run(
        ["bash", str(repo / "experiments" / "device.sh"), "model"],
        capture_output=True,
        text=True,
        cwd=repo,
        env=dict(
            os.environ, PY=sys.executable, OUT=str(tmp_path / "o"), MODEL_DIR=str(tmp_path / "m"), MODEL_SHA256=sha
        ),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "m" / "model.gguf").read_bytes() == gguf.read_bytes()
