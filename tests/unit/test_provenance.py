"""``oasis_core.provenance``: the one function that stamps the commit of a result."""

import re
import shutil
import subprocess

import pytest

from oasis_core import provenance

needs_git = pytest.mark.skipif(
    shutil.which("git") is None or not (provenance.ROOT / ".git").exists(), reason="needs a git checkout"
)


def test_the_environment_wins(monkeypatch):
    monkeypatch.setenv("OASIS_COMMIT", "abc1234")
    assert provenance.commit() == "abc1234"
    assert provenance.commit(full=True, dirty_paths=("oasis_core",), default=None) == "abc1234"


def test_without_a_checkout_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv("OASIS_COMMIT", raising=False)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)  # no .git here (nor above, in a temporary folder)
    assert provenance.commit() == "unknown"
    assert provenance.commit(full=True, default=None) is None
    assert provenance.status(("oasis_core",)) is None


@needs_git
def test_the_checkouts_head_short_or_full(monkeypatch):
    monkeypatch.delenv("OASIS_COMMIT", raising=False)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=provenance.ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance.commit(full=True) == head
    short = provenance.commit()
    assert re.fullmatch(r"[0-9a-f]{7,40}", short) and head.startswith(short)


@needs_git
def test_dirty_is_marked_from_the_paths_status(monkeypatch):
    monkeypatch.delenv("OASIS_COMMIT", raising=False)
    short = provenance.commit()
    monkeypatch.setattr(provenance, "status", lambda paths: " M oasis_core/x.py")
    assert provenance.commit(dirty_paths=("oasis_core",)) == short + "+dirty"
    monkeypatch.setattr(provenance, "status", lambda paths: "")
    assert provenance.commit(dirty_paths=("oasis_core",)) == short
    monkeypatch.setattr(provenance, "status", lambda paths: None)
    assert provenance.commit(dirty_paths=("oasis_core",)) == "unknown"
