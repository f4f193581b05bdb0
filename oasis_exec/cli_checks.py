"""Front-door checks for the hand-written command lines (``quality selection|endtoend``, ``draft_train``): every
bound and path said as its option, before a model is loaded, so a bad value is one line and exit 2, not a traceback
minutes into a run. Each check raises ``ValueError("--option: rule, got value")``."""

from __future__ import annotations

import math
import os
import re

from oasis_core.cliargs import CliError
from oasis_core.echo import show

DEVICE_PATTERN = r"cpu|cuda(:\d+)?"  # ExecConfig.device and the quality / draft_train checks


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _values(v):
    return v if isinstance(v, (list, tuple)) else [v]


def bounds(args, spec: dict) -> None:
    """``spec``: option dest -> (low, high, low_open). None values are skipped; every element of a list is checked."""
    for dest, (lo, hi, lo_open) in spec.items():
        v = getattr(args, dest, None)
        if v is None:
            continue
        for x in _values(v):
            bad = not math.isfinite(x) or (x <= lo if lo_open else x < lo) or (hi is not None and x > hi)
            if bad:
                side = "(" if lo_open else "["
                top = f"{hi}]" if hi is not None else "inf)"
                raise ValueError(f"{_flag(dest)}: must be in {side}{lo}, {top}, got {show(x)}")


def power_of_two(args, dest: str) -> None:
    v = getattr(args, dest, None)
    if v is not None and (v < 1 or v & (v - 1)):
        raise ValueError(f"{_flag(dest)}: must be a power of two, got {show(v)}")


def device(args, dest: str = "device") -> None:
    v = getattr(args, dest)

    if not re.fullmatch(DEVICE_PATTERN, v):
        raise ValueError(f"{_flag(dest)}: must be cpu, cuda or cuda:N, got {show(v)}")
    if v.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{_flag(dest)}: {v} asked for, but CUDA is not available here")


def existing(args, *dests: str, kind: str = "path") -> None:
    for dest in dests:
        v = getattr(args, dest, None)
        if v is None:
            continue
        ok = os.path.isdir(v) if kind == "dir" else os.path.isfile(v) if kind == "file" else os.path.exists(v)
        if not ok:
            raise ValueError(f"{_flag(dest)}: no such {kind}, got {show(v)}")


def writable_path(option: str, path: str | None) -> None:
    """Refuse an output file that cannot be written, before the run rather than after it: a folder, or a file whose
    folder cannot be made or written. Missing folders are created now (every command creates them anyway), so a
    place where no folder can be made (``/proc/x/``) fails here and not after the work."""
    if path is None:
        return
    if os.path.isdir(path):
        raise CliError(f"{option} {path}: is a folder")
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise CliError(f"{option} {path}: cannot create its folder: {e.strerror or type(e).__name__}") from None
    except RecursionError:  # os.makedirs recurses once per missing folder: thousands of them
        raise CliError(f"{option} {show(path)}: cannot create its folder: too deeply nested") from None
    if not os.access(d, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CliError(f"{option} {path}: not writable")


def writable_file(args, dest: str = "out") -> None:
    writable_path(_flag(dest), getattr(args, dest, None))


def writable_dir(args, dest: str = "out") -> None:
    """An output folder: it may not exist yet, but its parent must, and it must not be a file."""
    v = getattr(args, dest, None)
    if v is None:
        return
    if os.path.isfile(v):
        raise ValueError(f"{_flag(dest)}: is a file, want a folder, got {show(v)}")
    parent = os.path.dirname(os.path.abspath(v))
    if not os.path.isdir(v) and (not os.path.isdir(parent) or not os.access(parent, os.W_OK)):
        raise ValueError(f"{_flag(dest)}: folder {show(parent)} does not exist or is not writable, got {show(v)}")
