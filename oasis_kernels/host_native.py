"""The host path's CPU gather in C (``host_gather.c``), called through ctypes: one call per layer, without the GIL.

``host_gather_stage`` (torch ``index_select``) needs about ten torch calls per layer in the worker (the live mask,
the compaction, two gathers, the slot list), and each re-takes the GIL from a main thread that is launching kernels
or running the scheduler. ``gather_rows`` does the compaction, both row copies (OpenMP threads) and the slot list
in one foreign call, during which ctypes releases the GIL.

The library is compiled on first use with the system C compiler (``$CC``, else ``cc``) and ``-fopenmp`` (without it,
and serial, when the compiler lacks OpenMP: ``openmp()`` says which), and cached by source hash under
``$OASIS_CACHE_DIR`` (default ``~/.cache/oasiskv``). ``available()`` is False when no compiler is found.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SRC = Path(__file__).with_name("host_gather.c")


def _cache_dir() -> Path:
    d = Path(os.environ.get("OASIS_CACHE_DIR") or Path.home() / ".cache" / "oasiskv")
    try:
        d.mkdir(parents=True, exist_ok=True)
        return d
    except OSError:  # a read-only home: a per-user temporary directory
        d = Path(tempfile.gettempdir()) / f"oasiskv-{os.getuid()}"
        d.mkdir(parents=True, exist_ok=True)
        return d


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def available() -> bool:
    return _compiler() is not None


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise RuntimeError("host_kernel='native' needs a C compiler (cc or $CC); none found: use host_kernel='torch'")
    code = SRC.read_bytes()
    key = hashlib.sha1(code + cc.encode()).hexdigest()[:12]
    so = _cache_dir() / f"host_gather_{key}.so"
    if not so.exists():
        errors = []
        for flags in (["-fopenmp"], []):  # OpenMP if the compiler has it, else serial
            tmp = so.with_suffix(f".{os.getpid()}.tmp")
            r = subprocess.run(
                [cc, "-O3", "-shared", "-fPIC", *flags, str(SRC), "-o", str(tmp)], capture_output=True, text=True
            )
            if r.returncode == 0:
                os.replace(tmp, so)  # atomic: concurrent builders each write their own tmp
                break
            errors.append(r.stderr.strip()[-400:])
        else:
            raise RuntimeError(f"building {SRC.name} with {cc} failed: {' | '.join(errors)}")
    lib = ctypes.CDLL(str(so))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.oasis_gather_rows.argtypes = [p, p, i64, i64, p, p, i64, p, p, p, i64, p, i32]
    lib.oasis_gather_rows.restype = i64
    lib.oasis_gather_openmp.argtypes = []
    lib.oasis_gather_openmp.restype = i32
    return lib


def openmp() -> bool:
    """Whether the built library copies on OpenMP threads (False: serially)."""
    return bool(_lib().oasis_gather_openmp())


def _check(name, t, dtype=None):
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous CPU tensor")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")


class Gatherer:
    """One pipeline's native gather: a scratch row list of ``capacity`` entries and a thread count."""

    def __init__(self, capacity: int, n_threads: int):
        if n_threads < 1:
            raise ValueError("n_threads must be >= 1")
        self.lib = _lib()
        self.rows = torch.empty(max(int(capacity), 1), dtype=torch.int32)
        self.n_threads = int(n_threads)

    def gather_rows(self, host_k, host_v, flat, dst, n, stage_k, stage_v, dst_out) -> int:
        """Compact ``flat[:n]`` / ``dst[:n]`` (int32; flat -1 = padding) and copy the live rows of the flat
        ``[n_blocks * Hkv, bs * D]`` views of ``host_k``/``host_v`` into ``stage_k``/``stage_v[:m]``, their slots into
        ``dst_out[:m]`` and -1 into ``dst_out[m:]``. Returns m. Same result as ``host_gather_stage`` on the live
        entries (``tests/unit/test_kernels_host_native.py``)."""
        for name, t in (("host_k", host_k), ("host_v", host_v), ("stage_k", stage_k), ("stage_v", stage_v)):
            _check(name, t)
        for name, t in (("flat", flat), ("dst", dst), ("dst_out", dst_out)):
            _check(name, t, torch.int32)
        if host_k.shape != host_v.shape or host_k.dtype != host_v.dtype:
            raise ValueError("host_k and host_v must have one shape and dtype")
        nb, hkv = host_k.shape[0], host_k.shape[1]
        row_bytes = host_k[0, 0].numel() * host_k.element_size()
        if stage_k[0].numel() * stage_k.element_size() != row_bytes or stage_k.dtype != host_k.dtype:
            raise ValueError("staging rows must match the pool's (block_size, D) rows and dtype")
        cap = min(stage_k.shape[0], stage_v.shape[0], dst_out.shape[0])
        n = int(n)
        if not 0 <= n <= min(flat.shape[0], dst.shape[0]):
            raise ValueError(f"n={n} outside the copy list")
        if self.rows.shape[0] < cap:
            self.rows = torch.empty(cap, dtype=torch.int32)
        m = self.lib.oasis_gather_rows(
            host_k.data_ptr(),
            host_v.data_ptr(),
            row_bytes,
            nb * hkv,
            flat.data_ptr(),
            dst.data_ptr(),
            n,
            stage_k.data_ptr(),
            stage_v.data_ptr(),
            dst_out.data_ptr(),
            cap,
            self.rows.data_ptr(),
            self.n_threads,
        )
        if m < -n:
            raise ValueError(f"more live entries than the staging capacity {cap}")
        if m < 0:
            raise IndexError(f"copy list entry {-m - 1}: row {int(flat[-m - 1])} outside the pool's {nb * hkv}")
        return int(m)
