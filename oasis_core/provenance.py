"""Provenance: the commit a result was measured at. Every record, bench, study and recording stamps it here.

``commit()`` is ``$OASIS_COMMIT`` when set (a copy without ``.git``, e.g. a tree carried to a device machine), else
the checkout's ``HEAD`` (short unless ``full``), with ``+dirty`` when ``dirty_paths`` is given and one of them differs
from it; ``default`` when there is neither. ``status(paths)`` is ``git status --porcelain`` of some paths ('' when
clean, None when git cannot say). Both run git in the checkout that holds this package, whatever the caller's
directory. stdlib only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def status(paths: Sequence[str]) -> Optional[str]:
    """``git status --porcelain -- paths`` (paths relative to the checkout): '' when clean, None without git."""
    return _git("status", "--porcelain", "--", *paths)


def commit(*, dirty_paths: Sequence[str] = (), full: bool = False, default: Optional[str] = "unknown") -> Optional[str]:
    """The commit this code runs at (see the module docstring); ``default`` when it cannot be told."""
    env = os.environ.get("OASIS_COMMIT")
    if env:
        return env
    head = _git("rev-parse", "HEAD") if full else _git("rev-parse", "--short", "HEAD")
    if not head:
        return default
    if dirty_paths:
        st = status(dirty_paths)
        if st is None:
            return default
        if st:
            head += "+dirty"
    return head
